# nvml_client: a C client that loads the simulated libnvidia-ml.so.1 the way NVIDIA's go-nvml
# does (dlopen by soname + dlsym, no link against the library) and checks every expectation in
# docs/facts/nvml-clients.md. Included from tests/CMakeLists.txt.
#
# Each test runs against one node profile with its own state file; KGPU_SIM_STATE is inherited by
# the kgpu-simctl children the client starts, so they change the same simulated node.

add_executable(nvml_client ${CMAKE_CURRENT_LIST_DIR}/nvml_client.c)
target_include_directories(nvml_client PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(nvml_client PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
kgpu_warnings(nvml_client)
# Not a link dependency (the client dlopens the library), but the tests need both built.
add_dependencies(nvml_client kgpu_simnvml kgpu-simctl)

foreach(profile IN ITEMS dgx-h100 dgx-a100-mig)
  add_test(NAME nvml_client.${profile}
           COMMAND nvml_client ${PROJECT_SOURCE_DIR}/simnvml/symbols.txt $<TARGET_FILE:kgpu-simctl>)
  set_tests_properties(nvml_client.${profile} PROPERTIES
    ENVIRONMENT "LD_LIBRARY_PATH=$<TARGET_FILE_DIR:kgpu_simnvml>;KGPU_SIM_NODE=${profile};KGPU_SIM_STATE=${CMAKE_CURRENT_BINARY_DIR}/nvml_client.${profile}.state"
    LABELS integration
    TIMEOUT 120)
endforeach()
