// The libcpp-httplib functions that kgpu calls (the exporter's /metrics server,
// src/exporter/exporter.cc, and its web config, src/common/web_config.cc; the extender's and the
// webhook's HTTP(S) servers, src/extender/), defined in the kgpu executable and forwarded to
// libcpp-httplib.so.0.11, loaded when the first httplib::Server is constructed (src/cli/lazy_lib.h
// says why).
//
// They are C++ member functions, so each is defined here under its mangled name (Debian 12's
// cpp-httplib 0.11.4, GCC's C++11 std::string ABI) at the level of the Itanium C++ ABI, which is
// what the caller compiled against <httplib.h> uses: `this` comes first, a `const std::string&`
// is a pointer, and a std::function taken by value is passed as the address of the caller's
// temporary (which the caller destroys). Forwarding those words unchanged makes exactly the call
// the caller made; nothing is constructed or destroyed here. This file must not include
// <httplib.h>, whose declarations of the same symbols would clash. A call of another httplib
// function makes the linker keep libcpp-httplib as a DT_NEEDED of kgpu again, which
// tests/integration/lazy_libs_test.sh reports: add its forwarder here.

#include <cstdio>
#include <cstdlib>

#include "cli/lazy_lib.h"

namespace {

kgpu::cli::lazy::Lib& Httplib() {
  static kgpu::cli::lazy::Lib lib("libcpp-httplib.so.0.11", "libcpp-httplib0.11");
  return lib;
}

// The real function: there is no httplib::Server without one, so a missing library or symbol
// ends the process with the reason (the package's Depends make this a broken installation).
template <typename Fn>
Fn Real(const char* mangled) {
  void* p = Httplib().Symbol(mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "kgpu: the HTTP servers (exporter, extender, webhook) need %s\n",
                 Httplib().Error().empty() ? mangled : Httplib().Error().c_str());
    std::exit(1);
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

// The mangled names, each used twice: as the symbol defined here and as the one looked up.
#define KGPU_SERVER_CTOR "_ZN7httplib6ServerC1Ev"
#define KGPU_BIND_TO_PORT "_ZN7httplib6Server12bind_to_portERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEii"
#define KGPU_SET_TCP_NODELAY "_ZN7httplib6Server15set_tcp_nodelayEb"
#define KGPU_SET_SOCKET_OPTIONS "_ZN7httplib6Server18set_socket_optionsESt8functionIFviEE"
#define KGPU_BIND_TO_ANY_PORT \
  "_ZN7httplib6Server16bind_to_any_portERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEi"
#define KGPU_LISTEN_AFTER_BIND "_ZN7httplib6Server17listen_after_bindEv"
#define KGPU_GET                                                                                     \
  "_ZN7httplib6Server3GetERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt8functionIFvRKNS_" \
  "7RequestERNS_8ResponseEEE"
#define KGPU_STOP "_ZN7httplib6Server4stopEv"
#define KGPU_SET_CONTENT "_ZN7httplib8Response11set_contentERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_"
#define KGPU_SET_HEADER "_ZN7httplib8Response10set_headerERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_"
#define KGPU_IS_RUNNING "_ZNK7httplib6Server10is_runningEv"
// The extender's and the webhook's servers (src/extender/server.cc, webhook.cc).
#define KGPU_POST                                                                                     \
  "_ZN7httplib6Server4PostERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt8functionIFvRKNS_" \
  "7RequestERNS_8ResponseEEE"
#define KGPU_SET_KEEP_ALIVE_TIMEOUT "_ZN7httplib6Server22set_keep_alive_timeoutEl"
#define KGPU_SET_KEEP_ALIVE_MAX_COUNT "_ZN7httplib6Server24set_keep_alive_max_countEm"
#define KGPU_SET_PAYLOAD_MAX_LENGTH "_ZN7httplib6Server22set_payload_max_lengthEm"
#define KGPU_SSL_SERVER_CTOR "_ZN7httplib9SSLServerC1EPKcS2_S2_S2_S2_"
#define KGPU_SSL_IS_VALID "_ZNK7httplib9SSLServer8is_validEv"
// The exporter's --web-config-file and --web-read-timeout/--web-write-timeout (src/common/web_config.cc,
// src/exporter/exporter.cc).
#define KGPU_SSL_CONTEXT "_ZNK7httplib9SSLServer11ssl_contextEv"
#define KGPU_SET_READ_TIMEOUT "_ZN7httplib6Server16set_read_timeoutEll"
#define KGPU_SET_WRITE_TIMEOUT "_ZN7httplib6Server17set_write_timeoutEll"

// Each with the C++ signature it has in <httplib.h> above it; `self` is `this`.
extern "C" {
// httplib::Server::Server()
void KgpuHttplibServerCtor(void* self) __asm__(KGPU_SERVER_CTOR);
// bool httplib::Server::bind_to_port(const std::string& host, int port, int socket_flags)
bool KgpuHttplibBindToPort(void* self, const void* host, int port, int flags) __asm__(KGPU_BIND_TO_PORT);
// httplib::Server& httplib::Server::set_tcp_nodelay(bool on)
void* KgpuHttplibSetTcpNodelay(void* self, bool on) __asm__(KGPU_SET_TCP_NODELAY);
// httplib::Server& httplib::Server::set_socket_options(SocketOptions socket_options)
void* KgpuHttplibSetSocketOptions(void* self, void* options) __asm__(KGPU_SET_SOCKET_OPTIONS);
// int httplib::Server::bind_to_any_port(const std::string& host, int socket_flags)
int KgpuHttplibBindToAnyPort(void* self, const void* host, int flags) __asm__(KGPU_BIND_TO_ANY_PORT);
// bool httplib::Server::listen_after_bind()
bool KgpuHttplibListenAfterBind(void* self) __asm__(KGPU_LISTEN_AFTER_BIND);
// httplib::Server& httplib::Server::Get(const std::string& pattern, Handler handler)
void* KgpuHttplibGet(void* self, const void* pattern, void* handler) __asm__(KGPU_GET);
// void httplib::Server::stop()
void KgpuHttplibStop(void* self) __asm__(KGPU_STOP);
// void httplib::Response::set_content(const std::string& s, const std::string& content_type)
void KgpuHttplibSetContent(void* self, const void* s, const void* content_type) __asm__(KGPU_SET_CONTENT);
// void httplib::Response::set_header(const std::string& key, const std::string& val)
void KgpuHttplibSetHeader(void* self, const void* key, const void* val) __asm__(KGPU_SET_HEADER);
// bool httplib::Server::is_running() const
bool KgpuHttplibIsRunning(const void* self) __asm__(KGPU_IS_RUNNING);
// httplib::Server& httplib::Server::Post(const std::string& pattern, Handler handler)
void* KgpuHttplibPost(void* self, const void* pattern, void* handler) __asm__(KGPU_POST);
// httplib::Server& httplib::Server::set_keep_alive_timeout(time_t sec)
void* KgpuHttplibSetKeepAliveTimeout(void* self, long sec) __asm__(KGPU_SET_KEEP_ALIVE_TIMEOUT);
// httplib::Server& httplib::Server::set_keep_alive_max_count(size_t count)
void* KgpuHttplibSetKeepAliveMaxCount(void* self, unsigned long count) __asm__(KGPU_SET_KEEP_ALIVE_MAX_COUNT);
// httplib::Server& httplib::Server::set_payload_max_length(size_t length)
void* KgpuHttplibSetPayloadMaxLength(void* self, unsigned long length) __asm__(KGPU_SET_PAYLOAD_MAX_LENGTH);
// httplib::SSLServer::SSLServer(const char* cert_path, const char* private_key_path,
//     const char* client_ca_cert_file_path, const char* client_ca_cert_dir_path,
//     const char* private_key_password)
void KgpuHttplibSslServerCtor(void* self, const char* cert, const char* key, const char* ca_file, const char* ca_dir,
                              const char* key_password) __asm__(KGPU_SSL_SERVER_CTOR);
// bool httplib::SSLServer::is_valid() const
bool KgpuHttplibSslIsValid(const void* self) __asm__(KGPU_SSL_IS_VALID);
// SSL_CTX* httplib::SSLServer::ssl_context() const
void* KgpuHttplibSslContext(const void* self) __asm__(KGPU_SSL_CONTEXT);
// httplib::Server& httplib::Server::set_read_timeout(time_t sec, time_t usec)
void* KgpuHttplibSetReadTimeout(void* self, long sec, long usec) __asm__(KGPU_SET_READ_TIMEOUT);
// httplib::Server& httplib::Server::set_write_timeout(time_t sec, time_t usec)
void* KgpuHttplibSetWriteTimeout(void* self, long sec, long usec) __asm__(KGPU_SET_WRITE_TIMEOUT);

void KgpuHttplibServerCtor(void* self) {
  static const auto real = Real<void (*)(void*)>(KGPU_SERVER_CTOR);
  real(self);
}
bool KgpuHttplibBindToPort(void* self, const void* host, int port, int flags) {
  static const auto real = Real<bool (*)(void*, const void*, int, int)>(KGPU_BIND_TO_PORT);
  return real(self, host, port, flags);
}
void* KgpuHttplibSetTcpNodelay(void* self, bool on) {
  static const auto real = Real<void* (*)(void*, bool)>(KGPU_SET_TCP_NODELAY);
  return real(self, on);
}
void* KgpuHttplibSetSocketOptions(void* self, void* options) {
  static const auto real = Real<void* (*)(void*, void*)>(KGPU_SET_SOCKET_OPTIONS);
  return real(self, options);
}
int KgpuHttplibBindToAnyPort(void* self, const void* host, int flags) {
  static const auto real = Real<int (*)(void*, const void*, int)>(KGPU_BIND_TO_ANY_PORT);
  return real(self, host, flags);
}
bool KgpuHttplibListenAfterBind(void* self) {
  static const auto real = Real<bool (*)(void*)>(KGPU_LISTEN_AFTER_BIND);
  return real(self);
}
void* KgpuHttplibGet(void* self, const void* pattern, void* handler) {
  static const auto real = Real<void* (*)(void*, const void*, void*)>(KGPU_GET);
  return real(self, pattern, handler);
}
void KgpuHttplibStop(void* self) {
  static const auto real = Real<void (*)(void*)>(KGPU_STOP);
  real(self);
}
void KgpuHttplibSetContent(void* self, const void* s, const void* content_type) {
  static const auto real = Real<void (*)(void*, const void*, const void*)>(KGPU_SET_CONTENT);
  real(self, s, content_type);
}
void KgpuHttplibSetHeader(void* self, const void* key, const void* val) {
  static const auto real = Real<void (*)(void*, const void*, const void*)>(KGPU_SET_HEADER);
  real(self, key, val);
}
bool KgpuHttplibIsRunning(const void* self) {
  static const auto real = Real<bool (*)(const void*)>(KGPU_IS_RUNNING);
  return real(self);
}

void* KgpuHttplibPost(void* self, const void* pattern, void* handler) {
  static const auto real = Real<void* (*)(void*, const void*, void*)>(KGPU_POST);
  return real(self, pattern, handler);
}
void* KgpuHttplibSetKeepAliveTimeout(void* self, long sec) {
  static const auto real = Real<void* (*)(void*, long)>(KGPU_SET_KEEP_ALIVE_TIMEOUT);
  return real(self, sec);
}
void* KgpuHttplibSetKeepAliveMaxCount(void* self, unsigned long count) {
  static const auto real = Real<void* (*)(void*, unsigned long)>(KGPU_SET_KEEP_ALIVE_MAX_COUNT);
  return real(self, count);
}
void* KgpuHttplibSetPayloadMaxLength(void* self, unsigned long length) {
  static const auto real = Real<void* (*)(void*, unsigned long)>(KGPU_SET_PAYLOAD_MAX_LENGTH);
  return real(self, length);
}
void KgpuHttplibSslServerCtor(void* self, const char* cert, const char* key, const char* ca_file, const char* ca_dir,
                              const char* key_password) {
  static const auto real =
      Real<void (*)(void*, const char*, const char*, const char*, const char*, const char*)>(KGPU_SSL_SERVER_CTOR);
  real(self, cert, key, ca_file, ca_dir, key_password);
}
bool KgpuHttplibSslIsValid(const void* self) {
  static const auto real = Real<bool (*)(const void*)>(KGPU_SSL_IS_VALID);
  return real(self);
}
void* KgpuHttplibSslContext(const void* self) {
  static const auto real = Real<void* (*)(const void*)>(KGPU_SSL_CONTEXT);
  return real(self);
}
void* KgpuHttplibSetReadTimeout(void* self, long sec, long usec) {
  static const auto real = Real<void* (*)(void*, long, long)>(KGPU_SET_READ_TIMEOUT);
  return real(self, sec, usec);
}
void* KgpuHttplibSetWriteTimeout(void* self, long sec, long usec) {
  static const auto real = Real<void* (*)(void*, long, long)>(KGPU_SET_WRITE_TIMEOUT);
  return real(self, sec, usec);
}

}  // extern "C"
