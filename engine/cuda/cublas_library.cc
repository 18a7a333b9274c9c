#include "engine/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace kvstrata::engine {
namespace {

absl::StatusOr<CublasLibrary> Open() {
  const std::string file = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", file, " (cuBLAS, needed by --device cuda): ", dlerror()));
  }
  CublasLibrary lib;
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  bind(lib.create, "cublasCreate_v2");
  bind(lib.destroy, "cublasDestroy_v2");
  bind(lib.set_stream, "cublasSetStream_v2");
  bind(lib.set_workspace, "cublasSetWorkspace_v2");
  bind(lib.gemm_ex, "cublasGemmEx");
  bind(lib.status_string, "cublasGetStatusString");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(file, " lacks ", missing));
  }
  return lib;  // the handle stays open for the life of the process
}

}  // namespace

absl::StatusOr<const CublasLibrary*> OpenCublas() {
  static const absl::StatusOr<CublasLibrary>* const library =
      new absl::StatusOr<CublasLibrary>(Open());
  if (!library->ok()) return library->status();
  return &**library;
}

}  // namespace kvstrata::engine
