#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/strings.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {
namespace {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass: return "PASS";
    case Verdict::kWarn: return "WARN";
    case Verdict::kFail: return "FAIL";
  }
  return "?";
}

// Missing or not-a-character-device paths among `paths`.
void CheckNodes(const std::vector<std::string>& paths, std::vector<std::string>* missing,
                std::vector<std::string>* not_char) {
  for (const auto& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      missing->push_back(p);
    } else if (!S_ISCHR(st.st_mode)) {
      not_char->push_back(p);
    }
  }
}

}  // namespace

std::vector<Check> DoctorChecks(const NodeOptions& options) {
  std::vector<Check> checks;
  auto lib = nvml::Library::Open({options.nvml_library});
  if (!lib.ok()) {
    checks.push_back({"NVML library", Verdict::kFail, std::string(lib.status().message()),
                      "install the NVIDIA driver (its user-space libnvidia-ml.so.1), or set "
                      "--nvml-library / KGPU_NVML_LIBRARY to the library's path"});
    checks.push_back({"GPUs enumerable", Verdict::kFail, "skipped: NVML is not available",
                      "fix the NVML library check first"});
    return checks;
  }
  checks.push_back({"NVML library", Verdict::kPass, Cat("loaded ", (*lib)->path()), ""});

  auto driver = (*lib)->DriverVersion();
  auto cuda = (*lib)->CudaDriverVersion();
  if (driver.ok()) {
    checks.push_back({"Driver version", Verdict::kPass,
                      Cat(*driver, cuda.ok() ? Cat(" (CUDA ", *cuda / 1000, ".", (*cuda % 1000) / 10, ")")
                                             : std::string()),
                      ""});
  } else {
    checks.push_back({"Driver version", Verdict::kWarn, std::string(driver.status().message()),
                      "the driver and libnvidia-ml.so.1 may be from different releases: reinstall "
                      "the driver so both match"});
  }

  auto inv = gpu::Inventory::Discover(**lib, {options.sysfs_root});
  if (!inv.ok() || (*inv)->gpus().empty()) {
    checks.push_back({"GPUs enumerable", Verdict::kFail,
                      inv.ok() ? "NVML reports 0 GPUs" : std::string(inv.status().message()),
                      "check `lspci | grep -i nvidia` and `dmesg | grep -i nvrm`; in a container, "
                      "NVIDIA_VISIBLE_DEVICES=all and the NVIDIA runtime are needed"});
    return checks;
  }
  const auto& gpus = (*inv)->gpus();
  checks.push_back({"GPUs enumerable", Verdict::kPass, Cat(gpus.size(), " GPU(s): ", gpus[0].name), ""});

  // Device nodes the container runtime and the device plugin hand to pods.
  std::vector<std::string> nodes = {options.dev_root + "/nvidiactl", options.dev_root + "/nvidia-uvm"};
  for (const auto& g : gpus) {
    if (g.error.empty()) nodes.push_back(Cat(options.dev_root, "/nvidia", g.minor));
  }
  std::vector<std::string> missing, not_char;
  CheckNodes(nodes, &missing, &not_char);
  if (!missing.empty()) {
    checks.push_back({"Device nodes", Verdict::kFail, Cat("missing: ", Join(missing, ", ")),
                      "load the kernel modules and create the nodes (`nvidia-modprobe -c 0 -u`, or "
                      "`nvidia-smi` once as root); in a container, mount the host's /dev"});
  } else if (!not_char.empty()) {
    checks.push_back({"Device nodes", Verdict::kWarn,
                      Cat("not character devices: ", Join(not_char, ", ")),
                      "these paths exist but are not device nodes; pods given them cannot reach the GPU"});
  } else {
    checks.push_back({"Device nodes", Verdict::kPass, Cat(nodes.size(), " present"), ""});
  }

  std::vector<std::string> bad, pending;
  for (const auto& g : gpus) {
    if (g.lost) {
      bad.push_back(Cat("GPU ", g.index, " is lost (fell off the bus)"));
    } else if (!g.error.empty()) {
      bad.push_back(Cat("GPU ", g.index, ": ", g.error));
    } else if (g.mig_pending) {
      pending.push_back(Cat("GPU ", g.index));
    }
  }
  if (!bad.empty()) {
    checks.push_back({"GPUs healthy", Verdict::kFail, Join(bad, "; "),
                      "drain the node and reset the GPU (`nvidia-smi -r -i <index>`) or reboot; a "
                      "GPU that stays lost needs a hardware check"});
  } else if (!pending.empty()) {
    checks.push_back({"GPUs healthy", Verdict::kWarn,
                      Cat("MIG mode change pending a reset on ", Join(pending, ", ")),
                      "stop the GPU's workloads and reset it (`nvidia-smi -r -i <index>`) to apply "
                      "the MIG mode"});
  } else {
    checks.push_back({"GPUs healthy", Verdict::kPass, Cat("all ", gpus.size(), " readable"), ""});
  }
  return checks;
}

int RunDoctor(const NodeOptions& options, bool json, std::ostream& out) {
  const auto checks = DoctorChecks(options);
  bool failed = false;
  nlohmann::json j = nlohmann::json::array();
  for (const auto& c : checks) {
    failed = failed || c.verdict == Verdict::kFail;
    if (json) {
      j.push_back({{"check", c.name}, {"result", VerdictName(c.verdict)}, {"detail", c.detail},
                   {"fix", c.fix}});
      continue;
    }
    out << "[" << VerdictName(c.verdict) << "] " << c.name;
    for (size_t i = c.name.size(); i < 18; ++i) out << ' ';
    out << c.detail << "\n";
    if (!c.fix.empty()) out << "       fix: " << c.fix << "\n";
  }
  if (json) {
    out << j.dump(2) << "\n";
  } else {
    out << (failed ? "\nnvidia.com/gpu will NOT be usable on this node until the FAIL items are fixed.\n"
                   : "\nThis node can advertise nvidia.com/gpu.\n");
  }
  return failed ? 1 : 0;
}

}  // namespace kgpu::cli
