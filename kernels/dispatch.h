#pragma once

// Runtime -> compile-time dispatch, in one place, so a new kernel cannot forget a case and an
// unsupported shape fails with the same message everywhere.
//
//   KV_DISPATCH_HEAD_DIM(params.head_dim, HEAD_DIM, { return Launch<HEAD_DIM>(params); });

#define KV_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, ...) \
  [&]() -> cudaError_t {                              \
    switch (head_dim) {                               \
      case 64: {                                      \
        constexpr int HEAD_DIM = 64;                  \
        __VA_ARGS__                                   \
      }                                               \
      case 128: {                                     \
        constexpr int HEAD_DIM = 128;                 \
        __VA_ARGS__                                   \
      }                                               \
      default:                                        \
        return cudaErrorInvalidValue;                 \
    }                                                 \
  }()

namespace kvstrata::kernels {

// The message the launchers' callers report for a cudaErrorInvalidValue from dispatch.
inline const char* UnsupportedHeadDimMessage() { return "unsupported head_dim (64 or 128)"; }

}  // namespace kvstrata::kernels
