#include <chrono>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {

int RunHealth(const NodeOptions& options, std::chrono::seconds duration, std::chrono::milliseconds probe_interval,
              std::optional<std::chrono::milliseconds> recover_after, const volatile std::sig_atomic_t* stop,
              std::ostream& out) {
  const auto seconds = static_cast<unsigned>(duration.count());
  auto session = OpenSession(options);
  if (!session.ok()) {
    out << "kgpu health: " << session.status().message() << "\n";
    return 1;
  }
  std::mutex out_mu;
  gpu::HealthOptions ho;
  ho.probe_interval = probe_interval;
  ho.hang_threshold = std::max(probe_interval * 2, std::chrono::milliseconds(1000));
  ho.recover_after = recover_after;
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
