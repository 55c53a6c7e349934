// Minimal stand-in for CUDA's cuda_runtime_api.h, used only when no CUDA toolkit headers are
// found (CUDA_HOME / CUDA_PATH / /usr/local/cuda). TensorRT's public runtime headers include
// cuda_runtime_api.h but only name these handle types; the shim passes them through opaquely.
#ifndef INFER_TRT_CUDA_RUNTIME_API_STUB_H
#define INFER_TRT_CUDA_RUNTIME_API_STUB_H
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef int cudaError_t;
#endif
