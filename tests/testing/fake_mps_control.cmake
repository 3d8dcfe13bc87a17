# The MPS control stand-in: a fake nvidia-cuda-mps-control (same command protocol over
# <pipe dir>/control, records each command in <log dir>/control.log) for tests that cannot run the
# real one without a GPU. Built as fake-mps/bin/nvidia-cuda-mps-control. Included from
# tests/CMakeLists.txt.

add_executable(nvidia-cuda-mps-control ${CMAKE_CURRENT_LIST_DIR}/fake_mps_control.cc)
set_target_properties(nvidia-cuda-mps-control PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/fake-mps/bin)
kgpu_warnings(nvidia-cuda-mps-control)
