#pragma once

// cuBLAS opened at run time (dlopen) when a CUDA backend is created, rather than linked into
// every binary of the engine. Linked, its thread-local storage (about 110 KiB with cuBLASLt's)
// is carved out of every thread's stack in the process, and a library that starts threads with
// a small fixed stack then cannot start them (civetweb's 100 KiB threads, which served /metrics
// before core/http_server.h, failed that way). Opened, its storage is allocated per thread on use.

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace kvstrata::engine {

struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library, opened once per process (libcublas.so.<CUDA major> on the loader's path);
// FailedPrecondition naming the file and dlerror() when it cannot be opened.
absl::StatusOr<const CublasLibrary*> OpenCublas();

}  // namespace kvstrata::engine
