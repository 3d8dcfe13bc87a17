# The Kubernetes API server stand-in: a library for in-process tests and the
# kgpu-fake-apiserver command. Included from tests/CMakeLists.txt.
find_package(OpenSSL REQUIRED)
add_library(kgpu_fake_apiserver STATIC ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_admission.cc ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_codec.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_fields.cc ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_tables.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_defaults.cc ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_dra.cc
  ${CMAKE_CURRENT_LIST_DIR}/http_conn.cc)
target_include_directories(kgpu_fake_apiserver PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(kgpu_fake_apiserver PUBLIC kgpu_k8s kgpu_yaml PRIVATE PkgConfig::HTTPLIB OpenSSL::SSL OpenSSL::Crypto)
kgpu_warnings(kgpu_fake_apiserver)

add_executable(kgpu-fake-apiserver ${CMAKE_CURRENT_LIST_DIR}/fake_apiserver_main.cc)
target_link_libraries(kgpu-fake-apiserver PRIVATE kgpu_fake_apiserver CLI11::CLI11)
set_target_properties(kgpu-fake-apiserver PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
kgpu_warnings(kgpu-fake-apiserver)
