#pragma once
// Test helper: an HTTP/1.1 connection that sends exactly the bytes a test gives it (the headers a
// Go client, kubectl or client-go sends, Accept-Encoding: gzip included) and reads what comes back
// as it comes, so that a test sees when each byte of a streamed response arrives.
//
// Thread-safety: one RawHttp per thread.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kgpu::testing {

class RawHttp {
 public:
  explicit RawHttp(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) Close();
  }
  ~RawHttp() { Close(); }
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;

  bool ok() const { return fd_ >= 0; }

  // A GET as Go's net/http client sends it (kubectl, client-go): Host, User-Agent, Accept,
  // Accept-Encoding: gzip (Go's transport adds it unless compression is disabled).
  bool Get(const std::string& target, const std::string& accept = "application/json",
           const std::string& extra_headers = "") {
    return Send("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kubectl/v1.32.4 (linux/amd64)\r\n" +
                "Accept: " + accept + "\r\n" + extra_headers + "Accept-Encoding: gzip\r\n\r\n");
  }

  bool Send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads for up to `d` or until `stop` appears in what was received so far; returns false when
  // the server closed the connection.
  bool ReadFor(std::chrono::milliseconds d, const std::string& stop = "") {
    const auto deadline = std::chrono::steady_clock::now() + d;
    for (;;) {
      if (!stop.empty() && received_.find(stop) != std::string::npos) return true;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) <= 0) {
        if (left.count() <= 0) return true;  // what was there has been read (ReadFor(0ms) reads it)
        continue;
      }
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return false;
      received_.append(buf, static_cast<size_t>(n));
    }
  }

  const std::string& received() const { return received_; }
  // The response head (status line and headers), once received.
  std::string Head() const { return received_.substr(0, received_.find("\r\n\r\n")); }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

}  // namespace kgpu::testing
