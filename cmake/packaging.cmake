# Install rules and the Debian packages (`make package`, CPack DEB). Included from the top-level
# CMakeLists.txt after the targets exist.
#
#   kgpu       /usr/bin/kgpu and its documentation, and the CUDA memory interposer in a directory
#              of its version (/usr/lib/kgpu/<version>/libkgpu-cuda.so, docs/isolation.md), which
#              deploy/shares copies to the host. Depends: computed by dpkg-shlibdeps from the
#              binaries (CPACK_DEBIAN_PACKAGE_SHLIBDEPS), so they follow how they were linked.
#   kgpu-sim   the simulated NVML (/usr/lib/kgpu/sim/libnvidia-ml.so.1, outside the linker's path
#              so that it never shadows a real driver's library) and kgpu-simctl, for demos and CI:
#                KGPU_NVML_LIBRARY=/usr/lib/kgpu/sim/libnvidia-ml.so.1 kgpu devices
#
# The version is project(VERSION) in the top-level CMakeLists.txt, nowhere else.
include(GNUInstallDirs)

set(KGPU_SIM_LIBDIR lib/kgpu/sim)  # fixed, so that docs and tests can name it

install(TARGETS kgpu RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kgpu)
install(FILES README.md docs/exporter.md docs/mig-mps.md docs/isolation.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT kgpu)
install(DIRECTORY deploy/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kgpu/deploy COMPONENT kgpu)
install(TARGETS kgpu_cuda_interposer LIBRARY DESTINATION lib/kgpu/${PROJECT_VERSION} COMPONENT kgpu)

install(TARGETS kgpu_simnvml LIBRARY DESTINATION ${KGPU_SIM_LIBDIR} NAMELINK_SKIP COMPONENT sim)
install(TARGETS kgpu-simctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT sim)

# `cpack` (and `ninja install`) must not build the tests and benchmarks first.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kgpu)
set(CPACK_PACKAGE_VENDOR kgpu)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "kgpu maintainers <kgpu@localhost>")
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL kgpu sim)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/kgpu/kgpu")
set(CPACK_DEBIAN_KGPU_PACKAGE_NAME kgpu)

# The libraries kgpu loads with dlopen on first use (src/cli/lazy_lib.h) are no DT_NEEDED, so
# dpkg-shlibdeps does not see them: their Depends come from where it would have read them, the
# shlibs file of the Debian package that ships each soname.
function(kgpu_dlopen_depends out)
  set(deps "")
  foreach(soname ${ARGN})
    string(REGEX REPLACE "^(.*)\\.so\\.(.*)$" "\\1;\\2" parts "${soname}")
    list(GET parts 0 name)
    list(GET parts 1 version)
    execute_process(COMMAND dpkg-query -S "*/${soname}" OUTPUT_VARIABLE owner RESULT_VARIABLE rc ERROR_QUIET)
    string(REGEX MATCH "^[^:]+:[^:]+" pkg "${owner}")
    if(NOT rc EQUAL 0 OR NOT pkg)
      message(FATAL_ERROR "packaging: no installed Debian package ships ${soname} (run scripts/install-deps.sh)")
    endif()
    execute_process(COMMAND dpkg-query --control-show ${pkg} shlibs OUTPUT_VARIABLE shlibs RESULT_VARIABLE rc ERROR_QUIET)
    string(REGEX MATCH "(^|\n)${name} ${version} [^\n]+" line "${shlibs}")
    string(STRIP "${line}" line)
    if(NOT rc EQUAL 0 OR NOT line)
      message(FATAL_ERROR "packaging: ${pkg} has no shlibs entry for ${soname}")
    endif()
    string(REPLACE "${name} ${version} " "" dep "${line}")
    list(APPEND deps "${dep}")
  endforeach()
  list(JOIN deps ", " joined)
  set(${out} "${joined}" PARENT_SCOPE)
endfunction()
kgpu_dlopen_depends(CPACK_DEBIAN_KGPU_PACKAGE_DEPENDS libcurl.so.4 libcpp-httplib.so.0.11)
message(STATUS "packaging: kgpu Depends (dlopened libraries) ${CPACK_DEBIAN_KGPU_PACKAGE_DEPENDS} + dpkg-shlibdeps")
# Only `kgpu sim --plot FILE.png` loads librsvg (src/cli/svg_png.h): suggested, not required.
set(CPACK_DEBIAN_KGPU_PACKAGE_SUGGESTS "librsvg2-2")
set(CPACK_DEBIAN_SIM_PACKAGE_NAME kgpu-sim)
set(CPACK_COMPONENT_KGPU_DESCRIPTION
  "GPU node stack for Kubernetes\n kgpu is one binary that advertises NVIDIA GPUs to kubelet (a drop-in for NVIDIA's\n device plugin: whole GPUs, time-slicing, MIG, MPS), exports GPU metrics per pod\n (dcgm-exporter compatible) and checks a node (kgpu doctor). It loads the driver's\n libnvidia-ml.so.1 at run time.")
set(CPACK_COMPONENT_SIM_DESCRIPTION
  "simulated NVML node for kgpu demos and CI\n A libnvidia-ml.so.1 that simulates a GPU node (8x H100, A100 with MIG, ...) for\n unmodified NVML clients, and kgpu-simctl to inject faults (XID, ECC, lost GPUs) into it.\n The library lives in /usr/lib/kgpu/sim, off the linker's path: select it with\n KGPU_NVML_LIBRARY=/usr/lib/kgpu/sim/libnvidia-ml.so.1. Not for production nodes.")
include(CPack)
