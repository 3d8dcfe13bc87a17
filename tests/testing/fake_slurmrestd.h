#pragma once
// FakeSlurmrestd: slurmrestd 23.02's v0.0.39 REST API over HTTP, on loopback or a unix socket,
// answering from a FakeSlurm (its RestNodes/RestJobs/RestUpdate hold the semantics), so the
// bridge's REST backend (src/slurm/rest.h) runs the same scenarios as the CLI one. Debian 12's
// slurmrestd is 22.05, whose v0.0.38 cannot update a node, so there is no real one to test with.
// Authentication as rest_auth/jwt does it: with a token set, a request without the right
// X-SLURM-USER-TOKEN (and a user name) is 401 "Authentication failure" (plain text). Paths
// outside v0.0.39 are 404 (plain text), as on an older slurmrestd.
//
// Thread-safety: the server runs on its own thread; FakeSlurm locks its state.

#include <string>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include "common/http_listen.h"
#include "testing/fake_slurm.h"

namespace kgpu::testing {

class FakeSlurmrestd {
 public:
  // `socket_path` empty: loopback TCP on a free port.
  FakeSlurmrestd(FakeSlurm& slurm, std::string token = "", std::string socket_path = "")
      : slurm_(slurm), token_(std::move(token)), socket_(std::move(socket_path)) {
    auto reply = [](httplib::Response& res, const std::pair<int, nlohmann::json>& r) {
      res.status = r.first;
      res.set_content(r.second.dump(2), "application/json");
    };
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      ++requests_;
      if (token_.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("X-SLURM-USER-TOKEN") == token_ && !req.get_header_value("X-SLURM-USER-NAME").empty()) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      res.status = 401;
      res.set_content("Authentication failure", "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
    server_.Get("/slurm/v0.0.39/nodes",
                [this, reply](const httplib::Request&, httplib::Response& res) { reply(res, slurm_.RestNodes()); });
    server_.Get(R"(/slurm/v0.0.39/node/([^/]+))", [this, reply](const httplib::Request& req, httplib::Response& res) {
      reply(res, slurm_.RestNodes(req.matches[1]));
    });
    server_.Get("/slurm/v0.0.39/jobs",
                [this, reply](const httplib::Request&, httplib::Response& res) { reply(res, slurm_.RestJobs()); });
    server_.Post(R"(/slurm/v0.0.39/node/([^/]+))", [this, reply](const httplib::Request& req, httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_discarded() || req.get_header_value("Content-Type") != "application/json") {
        res.status = 400;
        res.set_content("Unable to parse query.", "text/plain");
        return;
      }
      reply(res, slurm_.RestUpdate(req.matches[1], body));
    });
    if (socket_.empty()) {
      port_ = server_.bind_to_any_port("127.0.0.1");
    } else {
      server_.set_address_family(AF_UNIX);
      port_ = server_.bind_to_port(socket_, 80) ? 80 : -1;
    }
    if (port_ > 0) thread_ = ListenOnThread(server_);
  }
  ~FakeSlurmrestd() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  // What RestOptions::url takes.
  std::string Url() const { return socket_.empty() ? "http://127.0.0.1:" + std::to_string(port_) : "unix:" + socket_; }
  bool ok() const { return port_ > 0; }
  int requests() const { return requests_; }

 private:
  FakeSlurm& slurm_;
  std::string token_, socket_;
  httplib::Server server_;
  int port_ = -1;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace kgpu::testing
