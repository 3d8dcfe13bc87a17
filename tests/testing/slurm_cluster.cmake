# The private Slurm cluster harness (tests/testing/slurm_cluster.h) and kgpu-slurm-testcluster,
# its command form for the demo. Included from tests/CMakeLists.txt.
add_library(kgpu_slurm_cluster STATIC ${CMAKE_CURRENT_LIST_DIR}/slurm_cluster.cc)
target_include_directories(kgpu_slurm_cluster PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(kgpu_slurm_cluster PUBLIC kgpu_slurm)
kgpu_warnings(kgpu_slurm_cluster)

add_executable(kgpu-slurm-testcluster ${CMAKE_CURRENT_LIST_DIR}/slurm_cluster_main.cc)
target_link_libraries(kgpu-slurm-testcluster PRIVATE kgpu_slurm_cluster CLI11::CLI11)
set_target_properties(kgpu-slurm-testcluster PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
kgpu_warnings(kgpu-slurm-testcluster)
