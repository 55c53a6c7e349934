// A C ABI over TensorRT's public C++ runtime API, for infer-trt's Rust side.
//
// Nothing here links against TensorRT. The Rust side dlopen()s libnvinfer / libnvinfer_lean /
// libnvinfer_dispatch, looks up `createInferRuntime_INTERNAL` and passes it in; every other call
// is a virtual call through the interfaces declared in the headers (NvInferRuntime.h).
// Errors from TensorRT's logger are kept per thread and read with itrt_last_error().

#include <NvInferRuntime.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace
{
thread_local std::string gLastError;

class Logger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR && msg != nullptr)
        {
            gLastError = msg;
        }
    }
};

Logger gLogger;

using CreateRuntimeFn = void* (*) (void*, int32_t);

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
} // namespace

extern "C"
{
    // Copies the last TensorRT error of this thread into buf (NUL-terminated); returns its length.
    size_t itrt_last_error(char* buf, size_t cap)
    {
        if (cap == 0)
        {
            return gLastError.size();
        }
        size_t n = gLastError.size() < cap - 1 ? gLastError.size() : cap - 1;
        std::memcpy(buf, gLastError.data(), n);
        buf[n] = '\0';
        return gLastError.size();
    }

    // The TensorRT version of the headers the shim was compiled against.
    int32_t itrt_header_version()
    {
        return static_cast<int32_t>(NV_TENSORRT_VERSION);
    }

    void* itrt_runtime_create(void* create_fn)
    {
        if (create_fn == nullptr)
        {
            return nullptr;
        }
        auto fn = reinterpret_cast<CreateRuntimeFn>(create_fn);
        return fn(&gLogger, static_cast<int32_t>(NV_TENSORRT_VERSION));
    }

    void itrt_runtime_destroy(void* rt)
    {
        delete static_cast<nvinfer1::IRuntime*>(rt);
    }

    // Version-compatible plans loaded by the full runtime run host code embedded in the plan.
    void itrt_runtime_set_host_code_allowed(void* rt, bool allowed)
    {
        static_cast<nvinfer1::IRuntime*>(rt)->setEngineHostCodeAllowed(allowed);
    }

    void* itrt_engine_deserialize(void* rt, void const* data, size_t size)
    {
        return static_cast<nvinfer1::IRuntime*>(rt)->deserializeCudaEngine(data, size);
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

    // nvinfer1::DataType as an integer (0 float, 1 half, 2 int8, 3 int32, 4 bool, 5 uint8, ...).
    int32_t itrt_engine_io_dtype(void* e, char const* name)
    {
        return static_cast<int32_t>(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorDataType(name));
    }

    int32_t itrt_engine_io_shape(void* e, char const* name, int64_t* out, int32_t cap)
    {
        return copyDims(static_cast<nvinfer1::ICudaEngine*>(e)->getTensorShape(name), out, cap);
    }

    int32_t itrt_engine_num_profiles(void* e)
    {
        return static_cast<nvinfer1::ICudaEngine*>(e)->getNbOptimizationProfiles();
    }

    // which: 0 min, 1 opt, 2 max (nvinfer1::OptProfileSelector).
    int32_t itrt_engine_profile_shape(void* e, char const* name, int32_t profile, int32_t which, int64_t* out, int32_t cap)
    {
        auto sel = static_cast<nvinfer1::OptProfileSelector>(which);
        return copyDims(static_cast<nvinfer1::ICudaEngine*>(e)->getProfileShape(name, profile, sel), out, cap);
    }

    void* itrt_context_create(void* e)
    {
        return static_cast<nvinfer1::ICudaEngine*>(e)->createExecutionContext();
    }

    void itrt_context_destroy(void* c)
    {
        delete static_cast<nvinfer1::IExecutionContext*>(c);
    }

    bool itrt_context_set_input_shape(void* c, char const* name, int64_t const* dims, int32_t n)
    {
        nvinfer1::Dims d{};
        if (n < 0 || n > nvinfer1::Dims::MAX_DIMS)
        {
            return false;
        }
        d.nbDims = n;
        for (int32_t i = 0; i < n; ++i)
        {
            d.d[i] = static_cast<decltype(d.d[0] + 0)>(dims[i]);
        }
        return static_cast<nvinfer1::IExecutionContext*>(c)->setInputShape(name, d);
    }

    // The shape of a tensor in this context (outputs are resolved once input shapes are set).
    int32_t itrt_context_tensor_shape(void* c, char const* name, int64_t* out, int32_t cap)
    {
        return copyDims(static_cast<nvinfer1::IExecutionContext*>(c)->getTensorShape(name), out, cap);
    }

    bool itrt_context_set_tensor_address(void* c, char const* name, void* ptr)
    {
        return static_cast<nvinfer1::IExecutionContext*>(c)->setTensorAddress(name, ptr);
    }

    // stream: a CUstream (the driver API handle is the runtime API's cudaStream_t).
    bool itrt_context_enqueue_v3(void* c, void* stream)
    {
        return static_cast<nvinfer1::IExecutionContext*>(c)->enqueueV3(static_cast<cudaStream_t>(stream));
    }
}
