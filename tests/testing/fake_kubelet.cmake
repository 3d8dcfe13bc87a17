# The kubelet stand-in: a library for tests, the kgpu-fake-kubelet tool for the demo and manual
# use, and the stand-in's own tests. Included from tests/CMakeLists.txt.

add_library(kgpu_fake_kubelet STATIC ${CMAKE_CURRENT_LIST_DIR}/fake_kubelet.cc)
target_include_directories(kgpu_fake_kubelet PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(kgpu_fake_kubelet PUBLIC kgpu_proto absl::status absl::statusor Threads::Threads)
kgpu_warnings(kgpu_fake_kubelet)

# Its API side: the Node's status.capacity/allocatable from the registered resources.
add_library(kgpu_fake_kubelet_node STATIC ${CMAKE_CURRENT_LIST_DIR}/fake_kubelet_node.cc)
target_link_libraries(kgpu_fake_kubelet_node PUBLIC kgpu_fake_kubelet kgpu_k8s)
kgpu_warnings(kgpu_fake_kubelet_node)

# Its DRA manager: plugin registration, NodePrepare/UnprepareResources around a pod, the health stream.
add_library(kgpu_fake_kubelet_dra STATIC ${CMAKE_CURRENT_LIST_DIR}/fake_kubelet_dra.cc)
target_include_directories(kgpu_fake_kubelet_dra PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(kgpu_fake_kubelet_dra PUBLIC kgpu_proto kgpu_k8s absl::status absl::statusor Threads::Threads)
kgpu_warnings(kgpu_fake_kubelet_dra)

add_executable(kgpu-fake-kubelet ${CMAKE_CURRENT_LIST_DIR}/fake_kubelet_main.cc)
target_link_libraries(kgpu-fake-kubelet PRIVATE kgpu_fake_kubelet kgpu_fake_kubelet_node CLI11::CLI11)
set_target_properties(kgpu-fake-kubelet PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
kgpu_warnings(kgpu-fake-kubelet)

kgpu_add_test(fake_kubelet_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/fake_kubelet_test.cc LIBS kgpu_fake_kubelet
  LABEL unit)
