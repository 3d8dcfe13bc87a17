// Weak stubs for every exported NVML name (symbols.txt). The strong definitions in
// nvml_impl.cc win at link time; names that are not simulated keep the stub, which returns
// NVML_ERROR_NOT_SUPPORTED (3), so that a client's lazy PLT binding never fails with
// "symbol lookup error". The stubs take `...` so that they accept any argument list.
#define KGPU_STUB(name)                                                   \
  extern "C" __attribute__((weak, visibility("default"))) int name(...) { \
    return 3; /* NVML_ERROR_NOT_SUPPORTED */                              \
  }
#include "nvml_stubs.inc"  // generated from symbols.txt by CMake
