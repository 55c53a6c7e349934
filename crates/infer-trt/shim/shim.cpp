// A C ABI over TensorRT's public C++ runtime API, for infer-trt's Rust side.
//
// Nothing here links against TensorRT. The Rust side dlopen()s libnvinfer / libnvinfer_lean /
// libnvinfer_dispatch, looks up `createInferRuntime_INTERNAL` and `getInferLibVersion` and passes
// them in; every other call is a virtual call through the interfaces declared in the headers
// (NvInferRuntime.h), whose virtual-table layout is only valid for the major version the shim was
// compiled against: runtime creation refuses a library of another major before calling into it.
//
// Errors: every call that can fail takes an `err` buffer of `cap` bytes and writes into it what
// TensorRT's logger reported at error severity during that call (or the shim's own reason), so
// an error text is never stale and never another call's. The logger counts errors per thread, so
// a call fails when TensorRT logged an error on the calling thread during it, even if it returned
// a usable-looking pointer, and never because another thread's call logged one (instances are
// created and run on several threads).

#include <NvInferRuntime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#ifdef ITRT_TEST_HOOKS
#include <thread>
#endif

namespace
{
// Errors logged on this thread since the current shim call began.
thread_local std::string tCaptured;
// Errors logged on this thread, ever (a call compares the count before and after; a thread's own
// counter needs no lock and cannot see another thread's errors).
thread_local uint64_t tErrorCount = 0;
// The last error logged on any thread (TensorRT's worker threads log outside a shim call), and
// how many have been logged: a failing call with nothing logged on its own thread names it only
// when it was logged during the call.
std::mutex gOtherMutex;
std::string gOther;
std::atomic<uint64_t> gOtherCount{0};

class Logger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override
    {
        if (severity > Severity::kERROR)
        {
            return;
        }
        ++tErrorCount;
        try
        {
            std::string text = msg != nullptr ? msg : "(no message)";
            if (!tCaptured.empty())
            {
                tCaptured += "; ";
            }
            tCaptured += text;
            std::lock_guard<std::mutex> lock(gOtherMutex);
            gOther = text;
            gOtherCount.fetch_add(1);
        }
        catch (...)
        {
        }
    }
};

Logger gLogger;

// Serialises setEngineHostCodeAllowed + deserializeCudaEngine (two calls on one runtime).
std::mutex gDeserializeMutex;

using CreateRuntimeFn = void* (*) (void*, int32_t);
using VersionFn = int32_t (*)();

// One shim call: clears this thread's captured errors at the start; `failed()` says whether any
// error was logged during the call, and `finish()` writes the error text into the caller's buffer.
class Call
{
public:
    Call(char* err, size_t cap) noexcept
        : mErr(err)
        , mCap(cap)
        , mStart(tErrorCount)
        , mOtherStart(gOtherCount.load())
    {
        tCaptured.clear();
        write("");
    }

    bool failed() const noexcept
    {
        return tErrorCount != mStart;
    }

    // Writes `reason`, followed by what TensorRT logged during the call, into the buffer.
    void fail(char const* reason) noexcept
    {
        try
        {
            std::string text = reason;
            std::string logged = tCaptured;
            if (logged.empty() && gOtherCount.load() != mOtherStart)
            {
                // Nothing logged on this thread: an error another thread logged during the call
                // (TensorRT's own worker threads) is the best explanation there is, said as such.
                std::lock_guard<std::mutex> lock(gOtherMutex);
                logged = "during the call, on another thread: " + gOther;
            }
            if (!logged.empty())
            {
                text += ": ";
                text += logged;
            }
            write(text.c_str());
        }
        catch (...)
        {
            write(reason);
        }
    }

private:
    void write(char const* text) noexcept
    {
        if (mErr == nullptr || mCap == 0)
        {
            return;
        }
        size_t n = std::strlen(text);
        n = n < mCap - 1 ? n : mCap - 1;
        std::memcpy(mErr, text, n);
        mErr[n] = '\0';
    }

    char* mErr;
    size_t mCap;
    uint64_t mStart;
    uint64_t mOtherStart;
};

template <typename D>
int32_t copyDims(D const& dims, int64_t* out, int32_t cap) noexcept
{
    if (dims.nbDims < 0)
    {
        return dims.nbDims;
    }
    for (int32_t i = 0; i < dims.nbDims && i < cap; ++i)
    {
        out[i] = static_cast<int64_t>(dims.d[i]);
    }
    return dims.nbDims;
}

// The major of a getInferLibVersion() value: 8601 → 8 (8.x), 100800 → 10 (10.x and later).
int32_t majorOf(int32_t version) noexcept
{
    return version >= 100000 ? version / 10000 : version / 1000;
}

// The minor of such a value: 8601 → 6, 101600 → 16.
int32_t minorOf(int32_t version) noexcept
{
    return version >= 100000 ? (version / 100) % 100 : (version / 100) % 10;
}
} // namespace

extern "C"
{
    // The TensorRT version of the headers the shim was compiled against (NV_TENSORRT_VERSION).
    int32_t itrt_header_version()
    {
        return static_cast<int32_t>(NV_TENSORRT_VERSION);
    }

    // The major version of those headers.
    int32_t itrt_header_major()
    {
        return static_cast<int32_t>(NV_TENSORRT_MAJOR);
    }

    // Creates an IRuntime with `create_fn` (the library's createInferRuntime_INTERNAL) after
    // checking, with `version_fn` (the same library's getInferLibVersion), that the library has the
    // headers' major version and is not an older release of it. Returns null, with the reason in
    // `err`, on a version mismatch (before any other call into the library), on a null result, and
    // when TensorRT logged an error during creation (a runtime created without a usable CUDA driver is not safe to use or to destroy,
    // so it is leaked, once, rather than destroyed).
    void* itrt_runtime_create(void* create_fn, void* version_fn, char* err, size_t cap)
    {
        Call call(err, cap);
        if (create_fn == nullptr || version_fn == nullptr)
        {
            call.fail("createInferRuntime_INTERNAL or getInferLibVersion is missing");
            return nullptr;
        }
        int32_t const lib = reinterpret_cast<VersionFn>(version_fn)();
        if (majorOf(lib) != NV_TENSORRT_MAJOR)
        {
            std::string reason = "the library is TensorRT " + std::to_string(majorOf(lib)) + ".x (version "
                + std::to_string(lib) + ") but this shim was compiled against TensorRT "
                + std::to_string(NV_TENSORRT_MAJOR) + ".x headers (version " + std::to_string(NV_TENSORRT_VERSION)
                + "); their virtual-table layouts differ, so the library is not used";
            call.fail(reason.c_str());
            return nullptr;
        }
        if (minorOf(lib) < minorOf(NV_TENSORRT_VERSION))
        {
            std::string reason = "the library is TensorRT " + std::to_string(majorOf(lib)) + "."
                + std::to_string(minorOf(lib)) + " (version " + std::to_string(lib)
                + "), older than the headers this shim was compiled against (version "
                + std::to_string(NV_TENSORRT_VERSION)
                + "); TensorRT is compatible only from older headers to newer libraries, so it is not used";
            call.fail(reason.c_str());
            return nullptr;
        }
        void* rt = reinterpret_cast<CreateRuntimeFn>(create_fn)(&gLogger, static_cast<int32_t>(NV_TENSORRT_VERSION));
        if (rt == nullptr)
        {
            call.fail("createInferRuntime returned null");
            return nullptr;
        }
        if (call.failed())
        {
            call.fail("createInferRuntime logged an error");
            return nullptr;
        }
        return rt;
    }

    void itrt_runtime_destroy(void* rt)
    {
        delete static_cast<nvinfer1::IRuntime*>(rt);
    }

    // Registers the full runtime's plugins: `init_fn` is libnvinfer_plugin's
    // `bool initLibNvInferPlugins(void* logger, char const* libNamespace)`, given the shim's logger.
    bool itrt_init_plugins(void* init_fn, char* err, size_t cap)
    {
        Call call(err, cap);
        using InitFn = bool (*)(void*, char const*);
        if (init_fn == nullptr || !reinterpret_cast<InitFn>(init_fn)(&gLogger, ""))
        {
            call.fail("initLibNvInferPlugins failed");
            return false;
        }
        return true;
    }

    // Loads a plugin library (the version-compatible libnvinfer_vc_plugin for the lean and dispatch
    // runtimes) into the runtime's plugin registry.
    bool itrt_runtime_load_plugin_library(void* rt, char const* path, char* err, size_t cap)
    {
        Call call(err, cap);
        auto& registry = static_cast<nvinfer1::IRuntime*>(rt)->getPluginRegistry();
        if (registry.loadLibrary(path) == nullptr || call.failed())
        {
            call.fail("IPluginRegistry::loadLibrary failed");
            return false;
        }
        return true;
    }

    // Deserializes a plan. `allow_host_code` (needed by version-compatible plans on the full
    // runtime) is set and the plan deserialized under one lock, so concurrent calls cannot race.
    void* itrt_engine_deserialize(void* rt, void const* data, size_t size, bool allow_host_code, char* err, size_t cap)
    {
        Call call(err, cap);
        auto runtime = static_cast<nvinfer1::IRuntime*>(rt);
        std::lock_guard<std::mutex> lock(gDeserializeMutex);
        runtime->setEngineHostCodeAllowed(allow_host_code);
        nvinfer1::ICudaEngine* engine = runtime->deserializeCudaEngine(data, size);
        if (engine == nullptr)
        {
            call.fail("deserializing the plan failed");
            return nullptr;
        }
        if (call.failed())
        {
            delete engine;
            call.fail("deserializing the plan logged an error");
            return nullptr;
        }
        return engine;
    }

    void itrt_engine_destroy(void* e)
    {
        delete static_cast<nvinfer1::ICudaEngine*>(e);
    }

    int32_t itrt_engine_num_io(void* e)
    {
        return static_cast<nvinfer1::ICudaEngine*>(e)->getNbIOTensors();
    }

    char const* itrt_engine_io_name(void* e, int32_t i)
    {
        return static_cast<nvinfer1::ICudaEngine*>(e)->getIOTensorName(i);
    }

    // 0 none, 1 input, 2 output (nvinfer1::TensorIOMode).
    int32_t itrt_engine_io_mode(void* e, char const* name)
    {
        return static_cast<int32_t>(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorIOMode(name));
    }

    // 0 device, 1 host (nvinfer1::TensorLocation): shape tensors live in host memory.
    int32_t itrt_engine_io_location(void* e, char const* name)
    {
        return static_cast<int32_t>(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorLocation(name));
    }

    // nvinfer1::DataType as an integer (0 float, 1 half, 2 int8, 3 int32, 4 bool, 5 uint8, 6 fp8,
    // 7 bf16, 8 int64, 9 int4, 10 fp4, 11 e8m0; later releases may add more).
    int32_t itrt_engine_io_dtype(void* e, char const* name)
    {
        return static_cast<int32_t>(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorDataType(name));
    }

    int32_t itrt_engine_io_shape(void* e, char const* name, int64_t* out, int32_t cap)
    {
        return copyDims(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorShape(name), out, cap);
    }

    // nvinfer1::TensorFormat of a tensor (0 kLINEAR; the others are vectorized or channel-last
    // layouts that infer-serve does not exchange).
    int32_t itrt_engine_io_format(void* e, char const* name)
    {
        return static_cast<int32_t>(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorFormat(name));
    }

    // The values (not the dimensions) optimisation profile `profile` allows for the shape tensor
    // input `name`, at `which` (0 min, 1 opt, 2 max): writes up to `cap` and returns how many the
    // tensor has, or -1 when TensorRT gives none (not a shape tensor).
    int32_t itrt_engine_profile_values(
        void* e, char const* name, int32_t profile, int32_t which, int64_t* out, int32_t cap)
    {
        auto engine = static_cast<nvinfer1::ICudaEngine*>(e);
        nvinfer1::Dims const d = engine->getTensorShape(name);
        if (d.nbDims < 0)
        {
            return -1;
        }
        int64_t count = 1;
        for (int32_t i = 0; i < d.nbDims; ++i)
        {
            if (d.d[i] < 0)
            {
                return -1;
            }
            count *= d.d[i];
        }
        auto sel = static_cast<nvinfer1::OptProfileSelector>(which);
#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 11)
        // 10.11 added the 64-bit form and deprecated the 32-bit one (gone in 11).
        int64_t const* values = engine->getProfileTensorValuesV2(name, profile, sel);
#elif NV_TENSORRT_MAJOR == 10
        int32_t const* values = engine->getProfileTensorValues(name, profile, sel);
#else
        // 8.6 has only the binding-index form, deprecated there but the one that exists.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        int32_t const* values = engine->getProfileShapeValues(profile, engine->getBindingIndex(name), sel);
#pragma GCC diagnostic pop
#endif
        if (values == nullptr)
        {
            return -1;
        }
        for (int64_t i = 0; i < count && i < cap; ++i)
        {
            out[i] = static_cast<int64_t>(values[i]);
        }
        return static_cast<int32_t>(count);
    }

    int32_t itrt_engine_num_profiles(void* e)
    {
        return static_cast<nvinfer1::ICudaEngine*>(e)->getNbOptimizationProfiles();
    }

    // which: 0 min, 1 opt, 2 max (nvinfer1::OptProfileSelector).
    int32_t itrt_engine_profile_shape(
        void* e, char const* name, int32_t profile, int32_t which, int64_t* out, int32_t cap)
    {
        auto sel = static_cast<nvinfer1::OptProfileSelector>(which);
        return copyDims(static_cast<nvinfer1::ICudaEngine*>(e)->getProfileShape(name, profile, sel), out, cap);
    }

    void* itrt_context_create(void* e, char* err, size_t cap)
    {
        Call call(err, cap);
        nvinfer1::IExecutionContext* ctx = static_cast<nvinfer1::ICudaEngine*>(e)->createExecutionContext();
        if (ctx == nullptr)
        {
            call.fail("creating an execution context failed");
        }
        return ctx;
    }

    void itrt_context_destroy(void* c)
    {
        delete static_cast<nvinfer1::IExecutionContext*>(c);
    }

    // Selects optimisation profile `profile` for the context, on `stream` (TensorRT 8.6 gives
    // each context of an engine its own profile; the caller synchronizes the stream).
    bool itrt_context_set_profile(void* c, int32_t profile, void* stream, char* err, size_t cap)
    {
        Call call(err, cap);
        if (!static_cast<nvinfer1::IExecutionContext*>(c)->setOptimizationProfileAsync(
                profile, static_cast<cudaStream_t>(stream)))
        {
            call.fail("setOptimizationProfileAsync failed");
            return false;
        }
        return true;
    }

    bool itrt_context_set_input_shape(void* c, char const* name, int64_t const* dims, int32_t n, char* err, size_t cap)
    {
        Call call(err, cap);
        nvinfer1::Dims d{};
        if (n < 0 || n > nvinfer1::Dims::MAX_DIMS)
        {
            call.fail("too many dimensions");
            return false;
        }
        d.nbDims = n;
        for (int32_t i = 0; i < n; ++i)
        {
            d.d[i] = static_cast<decltype(d.d[0] + 0)>(dims[i]);
        }
        if (!static_cast<nvinfer1::IExecutionContext*>(c)->setInputShape(name, d))
        {
            call.fail("setInputShape failed");
            return false;
        }
        return true;
    }

    // The shape of a tensor in this context (outputs are resolved once input shapes are set).
    int32_t itrt_context_tensor_shape(void* c, char const* name, int64_t* out, int32_t cap)
    {
        return copyDims(static_cast<nvinfer1::IExecutionContext*>(c)->getTensorShape(name), out, cap);
    }

    bool itrt_context_set_tensor_address(void* c, char const* name, void* ptr, char* err, size_t cap)
    {
        Call call(err, cap);
        if (!static_cast<nvinfer1::IExecutionContext*>(c)->setTensorAddress(name, ptr))
        {
            call.fail("setTensorAddress failed");
            return false;
        }
        return true;
    }

#ifdef ITRT_TEST_HOOKS
    // Tests only (tests/shim_probe.c; never in the runtime's build): runs one call during which
    // another thread logs an error. Returns 0 when the call is not failed by it and its failure
    // text names it as another thread's; 1 when the call counted it; 2 when the text is wrong.
    int32_t itrt_test_foreign_error_during_call(char* err, size_t cap)
    {
        Call call(err, cap);
        std::thread other([] { gLogger.log(nvinfer1::ILogger::Severity::kERROR, "an error on a worker thread"); });
        other.join();
        if (call.failed())
        {
            return 1;
        }
        call.fail("a failure of this call");
        return std::strstr(err, "on another thread: an error on a worker thread") != nullptr ? 0 : 2;
    }
#endif

    // stream: a CUstream (the driver API handle is the runtime API's cudaStream_t).
    bool itrt_context_enqueue_v3(void* c, void* stream, char* err, size_t cap)
    {
        Call call(err, cap);
        if (!static_cast<nvinfer1::IExecutionContext*>(c)->enqueueV3(static_cast<cudaStream_t>(stream)))
        {
            call.fail("enqueueV3 failed");
            return false;
        }
        return true;
    }
}
