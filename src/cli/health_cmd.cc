#include <chrono>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {

int RunHealth(const NodeOptions& options, unsigned seconds, unsigned probe_ms, int recover_after_ms,
              const volatile std::sig_atomic_t* stop, std::ostream& out) {
  auto session = OpenSession(options);
  if (!session.ok()) {
    out << "kgpu health: " << session.status().message() << "\n";
    return 1;
  }
  std::mutex out_mu;
  gpu::HealthOptions ho;
  ho.probe_interval = std::chrono::milliseconds(probe_ms);
  ho.hang_threshold = std::chrono::milliseconds(std::max(probe_ms * 2, 1000U));
  if (recover_after_ms >= 0) ho.recover_after = std::chrono::milliseconds(recover_after_ms);
  gpu::HealthMonitor monitor(*session->lib, session->inventory, ho, [&](const std::vector<gpu::DeviceHealth>& changes) {
    std::lock_guard<std::mutex> lock(out_mu);
    for (const auto& c : changes) {
      out << "change: " << c.id << (c.healthy ? " Healthy" : " Unhealthy: " + c.reason) << "\n";
    }
    out.flush();
  });
  if (auto st = monitor.Start(); !st.ok()) {
    out << "kgpu health: " << st.message() << "\n";
    return 1;
  }
  {
    std::lock_guard<std::mutex> lock(out_mu);
    // What the running device plugin serves (faults it saw before this command started, e.g. an
    // XID event) counts too: the same current health as kubelet gets.
    const auto plugin = PluginServedHealth(options);
    for (const auto& [id, h] : monitor.Snapshot()) {
      const auto p = plugin.find(id);
      if (h.healthy && p != plugin.end() && !p->second.first) {
        out << "device: " << id << " Unhealthy: " << p->second.second << " (as the device plugin serves it)\n";
        continue;
      }
      out << "device: " << id << (h.healthy ? " Healthy" : " Unhealthy: " + h.reason) << "\n";
    }
    out << "watching (" << (seconds == 0 ? std::string("until interrupted") : std::to_string(seconds) + " s") << ")\n";
    out.flush();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (*stop == 0 && (seconds == 0 || std::chrono::steady_clock::now() < deadline)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  monitor.Stop();
  return 0;
}

}  // namespace kgpu::cli
