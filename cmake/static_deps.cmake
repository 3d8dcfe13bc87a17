# KGPU_STATIC_DEPS (ON in the release preset): link Abseil, protobuf, gRPC (the unsecure flavour:
# kgpu only speaks insecure gRPC over unix sockets) and its own dependencies (upb, re2, c-ares,
# address_sorting, gpr, zlib) and yaml-cpp from Debian 12's static archives instead of ~60 shared
# libraries. Why: every shared library costs the process its relocated, dirty pages and the
# touched pages of its code (~16 MB of the plugin's RSS was shared-library code), and start-up
# pays for loading and relocating them. Debian's libcpp-httplib, spdlog and fmt have no static
# archives and stay shared, as do libstdc++ and glibc.
#
# Included from the top-level CMakeLists.txt after find_package(absl) and find_package(yaml-cpp);
# proto/CMakeLists.txt calls kgpu_static_grpc() for gRPC and protobuf.

option(KGPU_STATIC_DEPS "Link absl, protobuf, gRPC (unsecure) and yaml-cpp statically" OFF)

# Points an imported target at the static archive next to its shared library.
function(kgpu_use_static_archive target)
  foreach(prop IMPORTED_LOCATION_NONE IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO
               IMPORTED_LOCATION_DEBUG IMPORTED_LOCATION_NOCONFIG IMPORTED_LOCATION)
    get_target_property(loc ${target} ${prop})
    if(loc AND loc MATCHES "\\.so")
      string(REGEX REPLACE "\\.so(\\.[0-9.]+)?$" ".a" archive "${loc}")
      if(NOT EXISTS "${archive}")
        message(FATAL_ERROR "KGPU_STATIC_DEPS: ${target}: no static archive ${archive} next to ${loc}")
      endif()
      set_target_properties(${target} PROPERTIES ${prop} "${archive}")
      string(REPLACE "IMPORTED_LOCATION" "IMPORTED_SONAME" soname_prop ${prop})
      set_property(TARGET ${target} PROPERTY ${soname_prop})
    endif()
  endforeach()
endfunction()

if(KGPU_STATIC_DEPS)
  get_property(imported DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} PROPERTY IMPORTED_TARGETS)
  set(n 0)
  foreach(t IN LISTS imported)
    if(t MATCHES "^absl::" OR t STREQUAL "yaml-cpp" OR t STREQUAL "yaml-cpp::yaml-cpp" OR t STREQUAL "ZLIB::ZLIB")
      get_target_property(type ${t} TYPE)
      if(type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "UNKNOWN_LIBRARY")
        kgpu_use_static_archive(${t})
        math(EXPR n "${n} + 1")
      endif()
    endif()
  endforeach()
  message(STATUS "KGPU_STATIC_DEPS: ${n} absl/yaml-cpp/zlib libraries linked from static archives")
  # Only what is referenced: unused sections of the archives' objects are dropped, and shared
  # libraries that nothing needs (libatomic) get no DT_NEEDED.
  add_link_options(-Wl,--gc-sections -Wl,--as-needed)

  # The plugin's resident code. A page of the executable counts in RSS once touched, and the
  # kernel maps file pages 64 KiB at a time around each fault, so code run at start-up that is
  # scattered over the 7.5 MB of text made ~5.6 MB of it resident for ~1.4 MB of functions run.
  # Each of kgpu's functions gets its own section, and lld places the sections of the functions
  # that `kgpu device-plugin` runs up to registration (cmake/kgpu-startup.order, made by
  # scripts/gen-startup-order.sh) next to each other at the front of .text; Debian's archives have
  # one .text per object, which moves as a whole. (Packing the relative relocations, DT_RELR,
  # would save another ~250 KB read at start-up, but Debian 12's lld 14 does not add the
  # GLIBC_ABI_DT_RELR version that glibc 2.36 insists on, and such a binary does not start.)
  add_compile_options(-ffunction-sections)
  find_program(KGPU_LLD NAMES ld.lld)
  if(KGPU_LLD)
    add_link_options(-fuse-ld=lld)
    set(KGPU_STARTUP_ORDER ${PROJECT_SOURCE_DIR}/cmake/kgpu-startup.order)
  else()
    message(WARNING "KGPU_STATIC_DEPS: ld.lld not found (Debian package lld): linking with the "
      "default linker, without cmake/kgpu-startup.order; the plugin's RSS will be ~1.5 MB larger")
  endif()
endif()

# Links `target` with its start-up code placed first (see above); nothing without lld.
function(kgpu_startup_order target)
  if(KGPU_STARTUP_ORDER)
    target_link_options(${target} PRIVATE -Wl,--symbol-ordering-file=${KGPU_STARTUP_ORDER}
      -Wl,--no-warn-symbol-ordering)
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${KGPU_STARTUP_ORDER})
  endif()
endfunction()

# gRPC and protobuf for kgpu_proto: the shared grpc++ (pkg-config) normally; with
# KGPU_STATIC_DEPS the static grpc++_unsecure and everything it needs, in one link group (the
# archives refer to each other), and protobuf's static archive. Sets KGPU_GRPC_LIBS in the caller.
function(kgpu_static_grpc)
  if(NOT KGPU_STATIC_DEPS)
    set(KGPU_GRPC_LIBS protobuf::libprotobuf PkgConfig::GRPCPP PARENT_SCOPE)
    return()
  endif()
  kgpu_use_static_archive(protobuf::libprotobuf)
  set(archives "")
  # absl's hash archives go inside the group too: a target that links absl::hash before gRPC
  # (CMake emits each target once, at its first use) would otherwise leave gRPC's references to
  # MixingHashState unresolved.
  foreach(name grpc++_unsecure grpc_unsecure upb re2 cares address_sorting gpr z absl_hash absl_city
      absl_low_level_hash absl_raw_hash_set)
    find_library(KGPU_STATIC_${name} NAMES lib${name}.a REQUIRED)
    list(APPEND archives ${KGPU_STATIC_${name}})
  endforeach()
  # gRPC's own absl dependencies, as the imported (now static) absl targets.
  set(absl_deps absl::flat_hash_map absl::inlined_vector absl::bind_front absl::statusor absl::status
      absl::cord absl::str_format absl::strings absl::synchronization absl::time absl::optional
      absl::variant absl::random_random absl::hash absl::raw_hash_set absl::base absl::core_headers
      absl::bad_optional_access absl::bad_variant_access absl::memory absl::span absl::utility)
  set(KGPU_GRPC_LIBS protobuf::libprotobuf "-Wl,--start-group" ${archives} "-Wl,--end-group" ${absl_deps}
      Threads::Threads atomic rt PARENT_SCOPE)
endfunction()
