#include "nvml/library.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <sstream>

#include <dlfcn.h>

#include "absl/strings/cord.h"
#include "common/strings.h"
#include "nvml/nvml_abi.h"

namespace kgpu::nvml {

// Every entry point kgpu uses: the member name (and type) first, then the names to probe,
// newest first. REQ marks the ones without which the library is not usable.
#define KGPU_NVML_ENTRIES(REQ, OPT)                                                                                   \
  REQ(nvmlInit_v2, "nvmlInit_v2", "nvmlInit")                                                                         \
  REQ(nvmlShutdown, "nvmlShutdown")                                                                                   \
  REQ(nvmlErrorString, "nvmlErrorString")                                                                             \
  REQ(nvmlDeviceGetCount_v2, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")                                           \
  REQ(nvmlDeviceGetHandleByIndex_v2, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")                   \
  OPT(nvmlSystemGetDriverVersion, "nvmlSystemGetDriverVersion")                                                       \
  OPT(nvmlSystemGetNVMLVersion, "nvmlSystemGetNVMLVersion")                                                           \
  OPT(nvmlSystemGetCudaDriverVersion_v2, "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")       \
  OPT(nvmlDeviceGetHandleByUUID, "nvmlDeviceGetHandleByUUID")                                                         \
  OPT(nvmlDeviceGetUUID, "nvmlDeviceGetUUID")                                                                         \
  OPT(nvmlDeviceGetName, "nvmlDeviceGetName")                                                                         \
  OPT(nvmlDeviceGetMinorNumber, "nvmlDeviceGetMinorNumber")                                                           \
  OPT(nvmlDeviceGetPciInfo_v3, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo")          \
  OPT(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2")                                                       \
  OPT(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo")                                                             \
  OPT(nvmlDeviceGetCudaComputeCapability, "nvmlDeviceGetCudaComputeCapability")                                       \
  OPT(nvmlDeviceGetEnforcedPowerLimit, "nvmlDeviceGetEnforcedPowerLimit")                                             \
  OPT(nvmlDeviceGetTemperature, "nvmlDeviceGetTemperature")                                                           \
  OPT(nvmlDeviceGetMigMode, "nvmlDeviceGetMigMode")                                                                   \
  OPT(nvmlDeviceGetMaxMigDeviceCount, "nvmlDeviceGetMaxMigDeviceCount")                                               \
  OPT(nvmlDeviceGetMigDeviceHandleByIndex, "nvmlDeviceGetMigDeviceHandleByIndex")                                     \
  OPT(nvmlDeviceGetGpuInstanceId, "nvmlDeviceGetGpuInstanceId")                                                       \
  OPT(nvmlDeviceGetComputeInstanceId, "nvmlDeviceGetComputeInstanceId")                                               \
  OPT(nvmlDeviceGetAttributes_v2, "nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes")                            \
  OPT(nvmlDeviceGetGpuInstanceById, "nvmlDeviceGetGpuInstanceById")                                                   \
  OPT(nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")                                                               \
  OPT(nvmlDeviceGetGpuInstanceProfileInfo, "nvmlDeviceGetGpuInstanceProfileInfo")                                     \
  OPT(nvmlDeviceSetMigMode, "nvmlDeviceSetMigMode")                                                                   \
  OPT(nvmlDeviceGetComputeMode, "nvmlDeviceGetComputeMode")                                                           \
  OPT(nvmlDeviceSetComputeMode, "nvmlDeviceSetComputeMode")                                                           \
  OPT(nvmlDeviceGetGpuInstancePossiblePlacements_v2, "nvmlDeviceGetGpuInstancePossiblePlacements_v2",                 \
      "nvmlDeviceGetGpuInstancePossiblePlacements")                                                                   \
  OPT(nvmlDeviceGetGpuInstances, "nvmlDeviceGetGpuInstances")                                                         \
  OPT(nvmlDeviceCreateGpuInstanceWithPlacement, "nvmlDeviceCreateGpuInstanceWithPlacement")                           \
  OPT(nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")                                                               \
  OPT(nvmlGpuInstanceGetComputeInstanceProfileInfo, "nvmlGpuInstanceGetComputeInstanceProfileInfo")                   \
  OPT(nvmlGpuInstanceCreateComputeInstance, "nvmlGpuInstanceCreateComputeInstance")                                   \
  OPT(nvmlGpuInstanceGetComputeInstances, "nvmlGpuInstanceGetComputeInstances")                                       \
  OPT(nvmlComputeInstanceDestroy, "nvmlComputeInstanceDestroy")                                                       \
  OPT(nvmlDeviceGetTopologyCommonAncestor, "nvmlDeviceGetTopologyCommonAncestor")                                     \
  OPT(nvmlDeviceGetNvLinkState, "nvmlDeviceGetNvLinkState")                                                           \
  OPT(nvmlDeviceGetNvLinkRemotePciInfo_v2, "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo") \
  OPT(nvmlDeviceGetNvLinkRemoteDeviceType, "nvmlDeviceGetNvLinkRemoteDeviceType")                                     \
  OPT(nvmlDeviceGetSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes")                                           \
  OPT(nvmlDeviceRegisterEvents, "nvmlDeviceRegisterEvents")                                                           \
  OPT(nvmlEventSetCreate, "nvmlEventSetCreate")                                                                       \
  OPT(nvmlEventSetFree, "nvmlEventSetFree")                                                                           \
  OPT(nvmlEventSetWait_v2, "nvmlEventSetWait_v2")                                                                     \
  OPT(nvmlDeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates")                                                 \
  OPT(nvmlDeviceGetEncoderUtilization, "nvmlDeviceGetEncoderUtilization")                                             \
  OPT(nvmlDeviceGetDecoderUtilization, "nvmlDeviceGetDecoderUtilization")                                             \
  OPT(nvmlDeviceGetClockInfo, "nvmlDeviceGetClockInfo")                                                               \
  OPT(nvmlDeviceGetPowerUsage, "nvmlDeviceGetPowerUsage")                                                             \
  OPT(nvmlDeviceGetTotalEnergyConsumption, "nvmlDeviceGetTotalEnergyConsumption")                                     \
  OPT(nvmlDeviceGetPcieReplayCounter, "nvmlDeviceGetPcieReplayCounter")                                               \
  OPT(nvmlDeviceGetTotalEccErrors, "nvmlDeviceGetTotalEccErrors")                                                     \
  OPT(nvmlDeviceGetRemappedRows, "nvmlDeviceGetRemappedRows")                                                         \
  OPT(nvmlDeviceGetFieldValues, "nvmlDeviceGetFieldValues")                                                           \
  OPT(nvmlDeviceGetComputeRunningProcesses_v3, "nvmlDeviceGetComputeRunningProcesses_v3",                             \
      "nvmlDeviceGetComputeRunningProcesses_v2")                                                                      \
  OPT(nvmlDeviceGetMPSComputeRunningProcesses_v3, "nvmlDeviceGetMPSComputeRunningProcesses_v3",                       \
      "nvmlDeviceGetMPSComputeRunningProcesses_v2")                                                                   \
  OPT(nvmlDeviceGetProcessUtilization, "nvmlDeviceGetProcessUtilization")                                             \
  OPT(nvmlDeviceGetMaxClockInfo, "nvmlDeviceGetMaxClockInfo")                                                         \
  OPT(nvmlDeviceGetApplicationsClock, "nvmlDeviceGetApplicationsClock")                                               \
  OPT(nvmlDeviceGetTemperatureThreshold, "nvmlDeviceGetTemperatureThreshold")                                         \
  OPT(nvmlDeviceGetPowerManagementLimit, "nvmlDeviceGetPowerManagementLimit")                                         \
  OPT(nvmlDeviceGetPowerManagementDefaultLimit, "nvmlDeviceGetPowerManagementDefaultLimit")                           \
  OPT(nvmlDeviceGetPowerManagementLimitConstraints, "nvmlDeviceGetPowerManagementLimitConstraints")                   \
  OPT(nvmlDeviceGetPerformanceState, "nvmlDeviceGetPerformanceState")                                                 \
  OPT(nvmlDeviceGetFanSpeed, "nvmlDeviceGetFanSpeed")                                                                 \
  OPT(nvmlDeviceGetCurrentClocksEventReasons, "nvmlDeviceGetCurrentClocksEventReasons")                               \
  OPT(nvmlDeviceGetCurrentClocksThrottleReasons, "nvmlDeviceGetCurrentClocksThrottleReasons")                         \
  OPT(nvmlDeviceGetPcieThroughput, "nvmlDeviceGetPcieThroughput")                                                     \
  OPT(nvmlDeviceGetCurrPcieLinkGeneration, "nvmlDeviceGetCurrPcieLinkGeneration")                                     \
  OPT(nvmlDeviceGetMaxPcieLinkGeneration, "nvmlDeviceGetMaxPcieLinkGeneration")                                       \
  OPT(nvmlDeviceGetCurrPcieLinkWidth, "nvmlDeviceGetCurrPcieLinkWidth")                                               \
  OPT(nvmlDeviceGetMaxPcieLinkWidth, "nvmlDeviceGetMaxPcieLinkWidth")                                                 \
  OPT(nvmlDeviceGetViolationStatus, "nvmlDeviceGetViolationStatus")                                                   \
  OPT(nvmlDeviceGetEccMode, "nvmlDeviceGetEccMode")                                                                   \
  OPT(nvmlDeviceGetBAR1MemoryInfo, "nvmlDeviceGetBAR1MemoryInfo")                                                     \
  OPT(nvmlDeviceGetPersistenceMode, "nvmlDeviceGetPersistenceMode")                                                   \
  OPT(nvmlDeviceGetSerial, "nvmlDeviceGetSerial")                                                                     \
  OPT(nvmlDeviceGetVbiosVersion, "nvmlDeviceGetVbiosVersion")                                                         \
  OPT(nvmlDeviceGetBrand, "nvmlDeviceGetBrand")                                                                       \
  OPT(nvmlDeviceGetArchitecture, "nvmlDeviceGetArchitecture")                                                         \
  OPT(nvmlDeviceGetInforomVersion, "nvmlDeviceGetInforomVersion")                                                     \
  OPT(nvmlDeviceGetInforomImageVersion, "nvmlDeviceGetInforomImageVersion")                                           \
  OPT(nvmlDeviceGetP2PStatus, "nvmlDeviceGetP2PStatus")                                                               \
  OPT(nvmlGpmQueryDeviceSupport, "nvmlGpmQueryDeviceSupport")                                                         \
  OPT(nvmlGpmSampleAlloc, "nvmlGpmSampleAlloc")                                                                       \
  OPT(nvmlGpmSampleFree, "nvmlGpmSampleFree")                                                                         \
  OPT(nvmlGpmSampleGet, "nvmlGpmSampleGet")                                                                           \
  OPT(nvmlGpmMigSampleGet, "nvmlGpmMigSampleGet")                                                                     \
  OPT(nvmlGpmMetricsGet, "nvmlGpmMetricsGet")

struct Library::Symbols {
#define KGPU_MEMBER(name, ...) decltype(&::name) name = nullptr;
  KGPU_NVML_ENTRIES(KGPU_MEMBER, KGPU_MEMBER)
#undef KGPU_MEMBER
  // NVML calls that have not returned yet (a hung driver): the library is not shut down or
  // unloaded under them.
  mutable std::atomic<int> in_flight{0};
};

namespace {

constexpr char kPayloadKey[] = "type.kgpu.dev/nvml-return";

absl::StatusCode CodeFor(int rc) {
  switch (static_cast<Return>(rc)) {
    case Return::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case Return::kNotSupported:
    case Return::kFunctionNotFound:
      return absl::StatusCode::kUnimplemented;
    case Return::kNoPermission:
      return absl::StatusCode::kPermissionDenied;
    case Return::kNotFound:
    case Return::kNoData:
      return absl::StatusCode::kNotFound;
    case Return::kTimeout:
      return absl::StatusCode::kDeadlineExceeded;
    case Return::kGpuIsLost:
      return absl::StatusCode::kUnavailable;
    case Return::kUninitialized:
    case Return::kDriverNotLoaded:
      return absl::StatusCode::kFailedPrecondition;
    case Return::kInUse:
      return absl::StatusCode::kAborted;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NvmlError(const Library::Symbols& s, const char* call, int rc) {
  const char* text = s.nvmlErrorString != nullptr ? s.nvmlErrorString(static_cast<nvmlReturn_t>(rc)) : "unknown error";
  absl::Status status(CodeFor(rc), Cat(call, ": ", text, " (NVML error ", rc, ")"));
  status.SetPayload(kPayloadKey, absl::Cord(std::to_string(rc)));
  return status;
}

absl::Status Missing(const Library::Symbols& s, const char* call) {
  return NvmlError(s, call, static_cast<int>(Return::kFunctionNotFound));
}

// Calls an NVML entry point; a missing (optional) symbol is FUNCTION_NOT_FOUND.
template <typename Fn, typename... A>
absl::Status Call(const Library::Symbols& s, const char* name, Fn fn, A... args) {
  if (fn == nullptr) return Missing(s, name);
  s.in_flight.fetch_add(1, std::memory_order_acq_rel);
  const nvmlReturn_t rc = fn(args...);
  s.in_flight.fetch_sub(1, std::memory_order_acq_rel);
  if (rc == NVML_SUCCESS) return absl::OkStatus();
  return NvmlError(s, name, rc);
}

#define KGPU_CALL(fn, ...) Call(*syms_, #fn, syms_->fn, __VA_ARGS__)

nvmlDevice_t H(Device d) {
  return static_cast<nvmlDevice_t>(d.handle);
}

void* Resolve(void* dl, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (void* p = dlsym(dl, n); p != nullptr) return p;
  }
  return nullptr;
}

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read at start-up
  return v != nullptr ? v : "";
}

constexpr const char* kSoname = "libnvidia-ml.so.1";
// Driver locations outside the loader's default path: the NVIDIA container toolkit's and the
// GPU Operator's driver roots.
constexpr const char* kExtraDirs[] = {"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                                      "/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib64"};

}  // namespace

Return ReturnOf(const absl::Status& status) {
  if (status.ok()) return Return::kSuccess;
  auto payload = status.GetPayload(kPayloadKey);
  if (!payload) return Return::kUnknown;
  return static_cast<Return>(std::atoi(std::string(*payload).c_str()));
}

bool IsNoValue(const absl::Status& status) {
  switch (ReturnOf(status)) {
    case Return::kNotSupported:
    case Return::kNoPermission:
    case Return::kNotFound:
    case Return::kNoData:
    case Return::kFunctionNotFound:
      return true;
    default:
      return false;
  }
}

bool IsGpuLost(const absl::Status& status) {
  return ReturnOf(status) == Return::kGpuIsLost;
}

std::vector<std::string> Library::SearchPath() {
  std::vector<std::string> dirs;
  std::stringstream ld(EnvOr("LD_LIBRARY_PATH"));
  for (std::string dir; std::getline(ld, dir, ':');) {
    if (!dir.empty()) dirs.push_back(dir);
  }
  dirs.emplace_back("/etc/ld.so.cache (ldconfig: /usr/lib/x86_64-linux-gnu, /usr/lib64, ...)");
  for (const char* d : kExtraDirs) dirs.emplace_back(d);
  return dirs;
}

absl::StatusOr<std::unique_ptr<Library>> Library::Open(const LoadOptions& options) {
  std::unique_ptr<Library> lib(new Library);
  lib->syms_ = std::make_unique<Symbols>();
  std::string tried;
  const std::string explicit_path = !options.path.empty() ? options.path : EnvOr("KGPU_NVML_LIBRARY");
  if (!explicit_path.empty()) {
    lib->dl_ = dlopen(explicit_path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (lib->dl_ == nullptr) {
      return absl::NotFoundError(Cat("cannot load the NVML library ", explicit_path, ": ", dlerror(),
                                     " (fix --nvml-library / KGPU_NVML_LIBRARY)"));
    }
  } else {
    lib->dl_ = dlopen(kSoname, RTLD_LAZY | RTLD_LOCAL);
    if (lib->dl_ == nullptr) tried = dlerror();
    for (const char* dir : kExtraDirs) {
      if (lib->dl_ != nullptr) break;
      lib->dl_ = dlopen(Cat(dir, "/", kSoname).c_str(), RTLD_LAZY | RTLD_LOCAL);
    }
    if (lib->dl_ == nullptr) {
      return absl::NotFoundError(
          Cat("cannot load ", kSoname, " (", tried, "); looked in: ", Join(SearchPath(), ", "),
              ". Install the NVIDIA driver on this node, run the container with the NVIDIA runtime, "
              "or point --nvml-library / KGPU_NVML_LIBRARY at the library"));
    }
  }
  Symbols& s = *lib->syms_;
  std::string missing;
#define KGPU_REQ(name, ...)                                                      \
  s.name = reinterpret_cast<decltype(s.name)>(Resolve(lib->dl_, {__VA_ARGS__})); \
  if (s.name == nullptr) missing += Cat(missing.empty() ? "" : ", ", #name);
#define KGPU_OPT(name, ...) s.name = reinterpret_cast<decltype(s.name)>(Resolve(lib->dl_, {__VA_ARGS__}));
  KGPU_NVML_ENTRIES(KGPU_REQ, KGPU_OPT)
#undef KGPU_REQ
#undef KGPU_OPT
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(s.nvmlShutdown != nullptr ? s.nvmlShutdown : nullptr), &info) != 0 &&
      info.dli_fname != nullptr) {
    lib->path_ = info.dli_fname;
  } else {
    lib->path_ = explicit_path.empty() ? kSoname : explicit_path;
  }
  if (!missing.empty()) {
    dlclose(lib->dl_);
    lib->dl_ = nullptr;
    return absl::FailedPreconditionError(Cat(lib->path_, " is not a usable NVML library: it lacks ", missing,
                                             " (install a driver of release 450 or newer)"));
  }
  const nvmlReturn_t rc = s.nvmlInit_v2();
  if (rc != NVML_SUCCESS) {
    absl::Status st = NvmlError(s, "nvmlInit", rc);
    dlclose(lib->dl_);
    lib->dl_ = nullptr;
    // The hint follows the return code; for any other code the library's own message (which
    // nvmlErrorString gave) is the whole story.
    const char* hint = "";
    switch (rc) {
      case NVML_ERROR_DRIVER_NOT_LOADED:
        hint = ": is the NVIDIA kernel driver loaded (lsmod | grep nvidia)?";
        break;
      case NVML_ERROR_NO_PERMISSION:
        hint =
            ": this process may not open the GPU device nodes (/dev/nvidiactl, /dev/nvidia*): run it as root or "
            "give the container the devices";
        break;
      case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        hint =
            ": the library and the kernel driver are of different versions (reboot after a driver upgrade, or "
            "mount the driver's own libnvidia-ml.so.1)";
        break;
      default:
        break;
    }
    absl::Status out(st.code(), Cat(st.message(), " with ", lib->path_, hint));
    st.ForEachPayload([&](auto key, const absl::Cord& value) { out.SetPayload(key, value); });
    return out;
  }
  return lib;
}

int Library::calls_in_flight() const {
  return syms_->in_flight.load(std::memory_order_acquire);
}

Library::~Library() {
  if (dl_ == nullptr) return;
  if (syms_->in_flight.load(std::memory_order_acquire) > 0) {
    // A thread is still inside NVML (a hung call its owner gave up waiting for): shutting down
    // or unmapping the library under it would crash it when the call returns. The process is
    // exiting or reloading; leave the library loaded and its symbol table in place.
    static std::vector<std::unique_ptr<Symbols>>* kept = new std::vector<std::unique_ptr<Symbols>>;
    kept->push_back(std::move(syms_));
    return;
  }
  syms_->nvmlShutdown();
  dlclose(dl_);
}

absl::StatusOr<std::string> Library::DriverVersion() const {
  char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlSystemGetDriverVersion, buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<std::string> Library::NvmlVersion() const {
  char buf[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlSystemGetNVMLVersion, buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<int> Library::CudaDriverVersion() const {
  int v = 0;
  if (auto st = KGPU_CALL(nvmlSystemGetCudaDriverVersion_v2, &v); !st.ok()) return st;
  return v;
}

absl::StatusOr<unsigned> Library::DeviceCount() const {
  unsigned n = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetCount_v2, &n); !st.ok()) return st;
  return n;
}

absl::StatusOr<Device> Library::DeviceByIndex(unsigned index) const {
  nvmlDevice_t d = nullptr;
  if (auto st = KGPU_CALL(nvmlDeviceGetHandleByIndex_v2, index, &d); !st.ok()) return st;
  return Device{d};
}

absl::StatusOr<Device> Library::DeviceByUuid(const std::string& uuid) const {
  nvmlDevice_t d = nullptr;
  if (auto st = KGPU_CALL(nvmlDeviceGetHandleByUUID, uuid.c_str(), &d); !st.ok()) return st;
  return Device{d};
}

absl::StatusOr<std::string> Library::Uuid(Device d) const {
  char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetUUID, H(d), buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<std::string> Library::Name(Device d) const {
  char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetName, H(d), buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<unsigned> Library::MinorNumber(Device d) const {
  unsigned minor = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetMinorNumber, H(d), &minor); !st.ok()) return st;
  return minor;
}

absl::StatusOr<PciInfo> Library::Pci(Device d) const {
  nvmlPciInfo_t pci{};
  if (auto st = KGPU_CALL(nvmlDeviceGetPciInfo_v3, H(d), &pci); !st.ok()) return st;
  return PciInfo{pci.busId, pci.domain, pci.bus, pci.device, pci.pciDeviceId, pci.pciSubSystemId};
}

absl::StatusOr<MemoryInfo> Library::Memory(Device d) const {
  if (syms_->nvmlDeviceGetMemoryInfo_v2 != nullptr) {
    nvmlMemory_v2_t m{};
    m.version = nvmlMemory_v2;
    auto st = KGPU_CALL(nvmlDeviceGetMemoryInfo_v2, H(d), &m);
    if (st.ok()) return MemoryInfo{m.total, m.reserved, m.used, m.free, true};
    if (!IsNoValue(st) && ReturnOf(st) != Return::kUnknown) return st;
  }
  nvmlMemory_t m{};
  if (auto st = KGPU_CALL(nvmlDeviceGetMemoryInfo, H(d), &m); !st.ok()) return st;
  return MemoryInfo{m.total, 0, m.used, m.free, false};
}

absl::StatusOr<std::pair<int, int>> Library::ComputeCapability(Device d) const {
  int major = 0, minor = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetCudaComputeCapability, H(d), &major, &minor); !st.ok()) {
    return st;
  }
  return std::make_pair(major, minor);
}

absl::StatusOr<unsigned> Library::PowerLimitMw(Device d) const {
  unsigned mw = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetEnforcedPowerLimit, H(d), &mw); !st.ok()) return st;
  return mw;
}

absl::StatusOr<unsigned> Library::TemperatureC(Device d) const {
  unsigned t = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetTemperature, H(d), NVML_TEMPERATURE_GPU, &t); !st.ok()) {
    return st;
  }
  return t;
}

absl::StatusOr<MigMode> Library::GetMigMode(Device d) const {
  unsigned current = 0, pending = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetMigMode, H(d), &current, &pending); !st.ok()) return st;
  return MigMode{current == NVML_DEVICE_MIG_ENABLE, pending == NVML_DEVICE_MIG_ENABLE};
}

absl::StatusOr<absl::Status> Library::SetMigMode(Device d, bool enable) const {
  nvmlReturn_t activation = NVML_SUCCESS;
  const unsigned mode = enable ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
  if (auto st = KGPU_CALL(nvmlDeviceSetMigMode, H(d), mode, &activation); !st.ok()) return st;
  if (activation == NVML_SUCCESS) return absl::OkStatus();
  return NvmlError(*syms_, "nvmlDeviceSetMigMode activation", activation);
}

absl::StatusOr<ComputeMode> Library::GetComputeMode(Device d) const {
  nvmlComputeMode_t mode = NVML_COMPUTEMODE_DEFAULT;
  if (auto st = KGPU_CALL(nvmlDeviceGetComputeMode, H(d), &mode); !st.ok()) return st;
  return static_cast<ComputeMode>(mode);
}

absl::Status Library::SetComputeMode(Device d, ComputeMode mode) const {
  return KGPU_CALL(nvmlDeviceSetComputeMode, H(d), static_cast<nvmlComputeMode_t>(mode));
}

absl::StatusOr<std::vector<GpuInstanceProfile>> Library::GpuInstanceProfiles(Device gpu) const {
  std::vector<GpuInstanceProfile> out;
  for (unsigned p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; ++p) {
    nvmlGpuInstanceProfileInfo_t info{};
    auto st = KGPU_CALL(nvmlDeviceGetGpuInstanceProfileInfo, H(gpu), p, &info);
    if (IsNoValue(st) || ReturnOf(st) == Return::kInvalidArgument) continue;  // not on this GPU
    if (!st.ok()) return st;
    out.push_back({p, info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.multiprocessorCount,
                   info.copyEngineCount, info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount});
  }
  return out;
}

absl::StatusOr<std::vector<Placement>> Library::GpuInstancePlacements(Device gpu, unsigned profile_id) const {
  unsigned count = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetGpuInstancePossiblePlacements_v2, H(gpu), profile_id, nullptr, &count);
      !st.ok()) {
    return st;
  }
  std::vector<nvmlGpuInstancePlacement_t> raw(count);
  if (count == 0) return std::vector<Placement>{};
  if (auto st = KGPU_CALL(nvmlDeviceGetGpuInstancePossiblePlacements_v2, H(gpu), profile_id, raw.data(), &count);
      !st.ok()) {
    return st;
  }
  std::vector<Placement> out;
  for (unsigned i = 0; i < count; ++i) out.push_back({raw[i].start, raw[i].size});
  return out;
}

absl::StatusOr<std::vector<GpuInstance>> Library::GpuInstances(Device gpu) const {
  auto profiles = GpuInstanceProfiles(gpu);
  if (!profiles.ok()) return profiles.status();
  std::vector<GpuInstance> out;
  for (const auto& p : *profiles) {
    std::vector<nvmlGpuInstance_t> gis(std::max(1U, p.max_instances));
    unsigned count = static_cast<unsigned>(gis.size());
    if (auto st = KGPU_CALL(nvmlDeviceGetGpuInstances, H(gpu), p.id, gis.data(), &count); !st.ok()) return st;
    for (unsigned i = 0; i < count; ++i) {
      nvmlGpuInstanceInfo_t info{};
      if (auto st = KGPU_CALL(nvmlGpuInstanceGetInfo, gis[i], &info); !st.ok()) return st;
      out.push_back({gis[i], info.id, p.index, p.id, {info.placement.start, info.placement.size}});
    }
  }
  return out;
}

absl::StatusOr<GpuInstance> Library::CreateGpuInstance(Device gpu, const GpuInstanceProfile& profile,
                                                       Placement placement) const {
  const nvmlGpuInstancePlacement_t p{placement.start, placement.size};
  nvmlGpuInstance_t gi = nullptr;
  if (auto st = KGPU_CALL(nvmlDeviceCreateGpuInstanceWithPlacement, H(gpu), profile.id, &p, &gi); !st.ok()) {
    return st;
  }
  nvmlGpuInstanceInfo_t info{};
  if (auto st = KGPU_CALL(nvmlGpuInstanceGetInfo, gi, &info); !st.ok()) return st;
  return GpuInstance{gi, info.id, profile.index, profile.id, {info.placement.start, info.placement.size}};
}

absl::Status Library::DestroyGpuInstance(const GpuInstance& gi) const {
  return KGPU_CALL(nvmlGpuInstanceDestroy, static_cast<nvmlGpuInstance_t>(gi.handle));
}

absl::StatusOr<std::vector<void*>> Library::ComputeInstances(const GpuInstance& gi) const {
  std::vector<void*> out;
  auto h = static_cast<nvmlGpuInstance_t>(gi.handle);
  for (unsigned p = 0; p < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; ++p) {
    nvmlComputeInstanceProfileInfo_t info{};
    auto st = KGPU_CALL(nvmlGpuInstanceGetComputeInstanceProfileInfo, h, p,
                        static_cast<unsigned>(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED), &info);
    if (IsNoValue(st) || ReturnOf(st) == Return::kInvalidArgument) continue;
    if (!st.ok()) return st;
    std::vector<nvmlComputeInstance_t> cis(std::max(1U, info.instanceCount));
    unsigned count = static_cast<unsigned>(cis.size());
    if (st = KGPU_CALL(nvmlGpuInstanceGetComputeInstances, h, info.id, cis.data(), &count); !st.ok()) return st;
    for (unsigned i = 0; i < count; ++i) out.push_back(cis[i]);
  }
  return out;
}

absl::Status Library::CreateFullComputeInstance(const GpuInstance& gi, unsigned gi_slices) const {
  auto h = static_cast<nvmlGpuInstance_t>(gi.handle);
  // The compute-instance profile that spans the whole GPU instance (what `nvidia-smi mig -C` makes).
  for (unsigned p = 0; p < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; ++p) {
    nvmlComputeInstanceProfileInfo_t info{};
    auto st = KGPU_CALL(nvmlGpuInstanceGetComputeInstanceProfileInfo, h, p,
                        static_cast<unsigned>(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED), &info);
    if (!st.ok() || info.sliceCount != gi_slices) continue;
    nvmlComputeInstance_t ci = nullptr;
    return KGPU_CALL(nvmlGpuInstanceCreateComputeInstance, h, info.id, &ci);
  }
  return NvmlError(*syms_, "nvmlGpuInstanceGetComputeInstanceProfileInfo", static_cast<int>(Return::kNotSupported));
}

absl::Status Library::DestroyComputeInstance(void* ci) const {
  return KGPU_CALL(nvmlComputeInstanceDestroy, static_cast<nvmlComputeInstance_t>(ci));
}

absl::StatusOr<std::vector<std::string>> Library::MigDeviceUuids(Device gpu) const {
  unsigned max = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetMaxMigDeviceCount, H(gpu), &max); !st.ok()) return st;
  std::vector<std::string> out;
  for (unsigned i = 0; i < max; ++i) {
    nvmlDevice_t mig = nullptr;
    auto st = KGPU_CALL(nvmlDeviceGetMigDeviceHandleByIndex, H(gpu), i, &mig);
    if (ReturnOf(st) == Return::kNotFound || ReturnOf(st) == Return::kInvalidArgument) continue;
    if (!st.ok()) return st;
    auto uuid = Uuid(Device{mig});
    if (!uuid.ok()) return uuid.status();
    out.push_back(*uuid);
  }
  return out;
}

absl::StatusOr<std::vector<MigDeviceInfo>> Library::MigDevices(Device gpu) const {
  unsigned max = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetMaxMigDeviceCount, H(gpu), &max); !st.ok()) return st;
  std::vector<MigDeviceInfo> out;
  for (unsigned i = 0; i < max; ++i) {
    nvmlDevice_t mig = nullptr;
    auto st = KGPU_CALL(nvmlDeviceGetMigDeviceHandleByIndex, H(gpu), i, &mig);
    if (ReturnOf(st) == Return::kNotFound || ReturnOf(st) == Return::kInvalidArgument) continue;
    if (!st.ok()) return st;
    MigDeviceInfo info;
    info.handle = Device{mig};
    if (st = KGPU_CALL(nvmlDeviceGetGpuInstanceId, mig, &info.gi); !st.ok()) return st;
    if (st = KGPU_CALL(nvmlDeviceGetComputeInstanceId, mig, &info.ci); !st.ok()) return st;
    nvmlDeviceAttributes_t attr{};
    if (st = KGPU_CALL(nvmlDeviceGetAttributes_v2, mig, &attr); !st.ok()) return st;
    info.gi_slices = attr.gpuInstanceSliceCount;
    info.ci_slices = attr.computeInstanceSliceCount;
    info.memory_mib = attr.memorySizeMB;
    info.sm_count = attr.multiprocessorCount;
    info.copy_engines = attr.sharedCopyEngineCount;
    info.decoders = attr.sharedDecoderCount;
    info.encoders = attr.sharedEncoderCount;
    info.jpegs = attr.sharedJpegCount;
    info.ofas = attr.sharedOfaCount;
    // The GI's profile index tells the "+me" style variants apart.
    nvmlGpuInstance_t gi = nullptr;
    nvmlGpuInstanceInfo_t gi_info{};
    if (KGPU_CALL(nvmlDeviceGetGpuInstanceById, H(gpu), info.gi, &gi).ok() &&
        KGPU_CALL(nvmlGpuInstanceGetInfo, gi, &gi_info).ok()) {
      for (unsigned p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; ++p) {
        nvmlGpuInstanceProfileInfo_t pi{};
        if (KGPU_CALL(nvmlDeviceGetGpuInstanceProfileInfo, H(gpu), p, &pi).ok() && pi.id == gi_info.profileId) {
          info.profile_index = p;
          info.memory_mib = pi.memorySizeMB;
          break;
        }
      }
    }
    out.push_back(info);
  }
  return out;
}

absl::StatusOr<int> Library::CommonAncestor(Device a, Device b) const {
  nvmlGpuTopologyLevel_t level = NVML_TOPOLOGY_INTERNAL;
  if (auto st = KGPU_CALL(nvmlDeviceGetTopologyCommonAncestor, H(a), H(b), &level); !st.ok()) {
    return st;
  }
  return static_cast<int>(level);
}

absl::StatusOr<std::vector<NvLink>> Library::ActiveNvLinks(Device d) const {
  std::vector<NvLink> links;
  for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
    nvmlEnableState_t active = NVML_FEATURE_DISABLED;
    auto st = KGPU_CALL(nvmlDeviceGetNvLinkState, H(d), link, &active);
    if (IsNoValue(st)) break;  // no NVLink on this GPU
    if (ReturnOf(st) == Return::kInvalidArgument) continue;
    if (!st.ok()) return st;
    if (active != NVML_FEATURE_ENABLED) continue;
    nvmlPciInfo_t pci{};
    if (st = KGPU_CALL(nvmlDeviceGetNvLinkRemotePciInfo_v2, H(d), link, &pci); !st.ok()) return st;
    NvLink l{link, pci.busId, false};
    nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    if (KGPU_CALL(nvmlDeviceGetNvLinkRemoteDeviceType, H(d), link, &type).ok()) {
      l.remote_is_switch = type == NVML_NVLINK_DEVICE_TYPE_SWITCH;
    }
    links.push_back(l);
  }
  return links;
}

absl::StatusOr<uint64_t> Library::SupportedEvents(Device d) const {
  unsigned long long types = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetSupportedEventTypes, H(d), &types); !st.ok()) return st;
  return types;
}

absl::StatusOr<Library::Utilization> Library::GetUtilization(Device d) const {
  nvmlUtilization_t u{};
  if (auto st = KGPU_CALL(nvmlDeviceGetUtilizationRates, H(d), &u); !st.ok()) return st;
  return Utilization{u.gpu, u.memory};
}

absl::StatusOr<unsigned> Library::EncoderUtilization(Device d) const {
  unsigned util = 0, period = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetEncoderUtilization, H(d), &util, &period); !st.ok()) return st;
  return util;
}

absl::StatusOr<unsigned> Library::DecoderUtilization(Device d) const {
  unsigned util = 0, period = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetDecoderUtilization, H(d), &util, &period); !st.ok()) return st;
  return util;
}

absl::StatusOr<unsigned> Library::ClockMhz(Device d, Clock clock) const {
  unsigned mhz = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetClockInfo, H(d), static_cast<nvmlClockType_t>(clock), &mhz); !st.ok()) {
    return st;
  }
  return mhz;
}

absl::StatusOr<unsigned> Library::PowerMw(Device d) const {
  unsigned mw = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetPowerUsage, H(d), &mw); !st.ok()) return st;
  return mw;
}

absl::StatusOr<uint64_t> Library::EnergyMj(Device d) const {
  unsigned long long mj = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetTotalEnergyConsumption, H(d), &mj); !st.ok()) return st;
  return mj;
}

absl::StatusOr<unsigned> Library::PcieReplayCounter(Device d) const {
  unsigned n = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetPcieReplayCounter, H(d), &n); !st.ok()) return st;
  return n;
}

absl::StatusOr<uint64_t> Library::EccErrors(Device d, bool uncorrected, bool aggregate) const {
  unsigned long long n = 0;
  auto st = KGPU_CALL(nvmlDeviceGetTotalEccErrors, H(d),
                      uncorrected ? NVML_MEMORY_ERROR_TYPE_UNCORRECTED : NVML_MEMORY_ERROR_TYPE_CORRECTED,
                      aggregate ? NVML_AGGREGATE_ECC : NVML_VOLATILE_ECC, &n);
  if (!st.ok()) return st;
  return n;
}

absl::StatusOr<Library::RemappedRows> Library::GetRemappedRows(Device d) const {
  RemappedRows r;
  if (auto st = KGPU_CALL(nvmlDeviceGetRemappedRows, H(d), &r.correctable, &r.uncorrectable, &r.pending, &r.failure);
      !st.ok()) {
    return st;
  }
  return r;
}

absl::StatusOr<std::vector<std::optional<uint64_t>>> Library::FieldValues(Device d,
                                                                          const std::vector<unsigned>& ids) const {
  std::vector<ScopedField> fields;
  fields.reserve(ids.size());
  for (unsigned id : ids) fields.push_back({id, 0});
  return ScopedFieldValues(d, fields);
}

absl::StatusOr<std::vector<std::optional<uint64_t>>> Library::ScopedFieldValues(
    Device d, const std::vector<ScopedField>& fields) const {
  std::vector<nvmlFieldValue_t> values(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    values[i].fieldId = fields[i].id;
    values[i].scopeId = fields[i].scope;
  }
  if (auto st = KGPU_CALL(nvmlDeviceGetFieldValues, H(d), static_cast<int>(values.size()), values.data()); !st.ok()) {
    return st;
  }
  std::vector<std::optional<uint64_t>> out;
  for (size_t i = 0; i < values.size(); ++i) {
    const nvmlFieldValue_t& v = values[i];
    if (v.nvmlReturn != NVML_SUCCESS) {
      out.emplace_back();
      continue;
    }
    // NVML_FI_DEV_MEMORY_TEMP: the reading is in uiVal whatever valueType says (nvbug 4300930: r545
    // reports it as a double; DCGM reads uiVal too), so the double's bytes are never read as degrees.
    if (fields[i].id == NVML_FI_DEV_MEMORY_TEMP) {
      out.emplace_back(v.value.uiVal);
      continue;
    }
    switch (v.valueType) {
      case NVML_VALUE_TYPE_DOUBLE:
        out.emplace_back(static_cast<uint64_t>(v.value.dVal));
        break;
      case NVML_VALUE_TYPE_UNSIGNED_INT:
        out.emplace_back(v.value.uiVal);
        break;
      case NVML_VALUE_TYPE_UNSIGNED_LONG:
        out.emplace_back(v.value.ulVal);
        break;
      case NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        out.emplace_back(static_cast<uint64_t>(v.value.sllVal));
        break;
      case NVML_VALUE_TYPE_SIGNED_INT:
        out.emplace_back(static_cast<uint64_t>(v.value.siVal));
        break;
      default:
        out.emplace_back(v.value.ullVal);
        break;
    }
  }
  return out;
}

absl::StatusOr<unsigned> Library::MaxClockMhz(Device d, Clock clock) const {
  unsigned mhz = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetMaxClockInfo, H(d), static_cast<nvmlClockType_t>(clock), &mhz); !st.ok()) {
    return st;
  }
  return mhz;
}

absl::StatusOr<unsigned> Library::ApplicationsClockMhz(Device d, Clock clock) const {
  unsigned mhz = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetApplicationsClock, H(d), static_cast<nvmlClockType_t>(clock), &mhz); !st.ok()) {
    return st;
  }
  return mhz;
}

absl::StatusOr<unsigned> Library::TemperatureThresholdC(Device d, TemperatureThreshold threshold) const {
  unsigned t = 0;
  if (auto st =
          KGPU_CALL(nvmlDeviceGetTemperatureThreshold, H(d), static_cast<nvmlTemperatureThresholds_t>(threshold), &t);
      !st.ok()) {
    return st;
  }
  return t;
}

absl::StatusOr<unsigned> Library::PowerManagementLimitMw(Device d) const {
  unsigned mw = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetPowerManagementLimit, H(d), &mw); !st.ok()) return st;
  return mw;
}

absl::StatusOr<unsigned> Library::PowerManagementDefaultLimitMw(Device d) const {
  unsigned mw = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetPowerManagementDefaultLimit, H(d), &mw); !st.ok()) return st;
  return mw;
}

absl::StatusOr<Library::PowerLimits> Library::PowerManagementLimitConstraints(Device d) const {
  PowerLimits p;
  if (auto st = KGPU_CALL(nvmlDeviceGetPowerManagementLimitConstraints, H(d), &p.min_mw, &p.max_mw); !st.ok()) {
    return st;
  }
  return p;
}

absl::StatusOr<unsigned> Library::PerformanceState(Device d) const {
  nvmlPstates_t p = NVML_PSTATE_UNKNOWN;
  if (auto st = KGPU_CALL(nvmlDeviceGetPerformanceState, H(d), &p); !st.ok()) return st;
  return static_cast<unsigned>(p);
}

absl::StatusOr<unsigned> Library::FanSpeedPercent(Device d) const {
  unsigned percent = 0;
  if (auto st = KGPU_CALL(nvmlDeviceGetFanSpeed, H(d), &percent); !st.ok()) return st;
  return percent;
}

absl::StatusOr<uint64_t> Library::ClocksEventReasons(Device d) const {
  unsigned long long reasons = 0;
  // The "event" call replaced the "throttle" one (same bits) in driver 535; older drivers have only
  // the latter, newer ones may drop it.
  if (syms_->nvmlDeviceGetCurrentClocksEventReasons != nullptr) {
    if (auto st = KGPU_CALL(nvmlDeviceGetCurrentClocksEventReasons, H(d), &reasons); !st.ok()) return st;
    return reasons;
  }
  if (auto st = KGPU_CALL(nvmlDeviceGetCurrentClocksThrottleReasons, H(d), &reasons); !st.ok()) return st;
  return reasons;
}

absl::StatusOr<unsigned> Library::PcieThroughputKBs(Device d, bool rx) const {
  unsigned kbs = 0;
  if (auto st =
          KGPU_CALL(nvmlDeviceGetPcieThroughput, H(d), rx ? NVML_PCIE_UTIL_RX_BYTES : NVML_PCIE_UTIL_TX_BYTES, &kbs);
      !st.ok()) {
    return st;
  }
  return kbs;
}

absl::StatusOr<unsigned> Library::PcieLinkGeneration(Device d, bool max) const {
  unsigned gen = 0;
  auto st = max ? KGPU_CALL(nvmlDeviceGetMaxPcieLinkGeneration, H(d), &gen)
                : KGPU_CALL(nvmlDeviceGetCurrPcieLinkGeneration, H(d), &gen);
  if (!st.ok()) return st;
  return gen;
}

absl::StatusOr<unsigned> Library::PcieLinkWidth(Device d, bool max) const {
  unsigned width = 0;
  auto st = max ? KGPU_CALL(nvmlDeviceGetMaxPcieLinkWidth, H(d), &width)
                : KGPU_CALL(nvmlDeviceGetCurrPcieLinkWidth, H(d), &width);
  if (!st.ok()) return st;
  return width;
}

absl::StatusOr<uint64_t> Library::ViolationNs(Device d, ViolationPolicy policy) const {
  nvmlViolationTime_t t{};
  if (auto st = KGPU_CALL(nvmlDeviceGetViolationStatus, H(d), static_cast<nvmlPerfPolicyType_t>(policy), &t);
      !st.ok()) {
    return st;
  }
  return t.violationTime;
}

absl::StatusOr<std::pair<bool, bool>> Library::EccMode(Device d) const {
  nvmlEnableState_t current = NVML_FEATURE_DISABLED, pending = NVML_FEATURE_DISABLED;
  if (auto st = KGPU_CALL(nvmlDeviceGetEccMode, H(d), &current, &pending); !st.ok()) return st;
  return std::make_pair(current == NVML_FEATURE_ENABLED, pending == NVML_FEATURE_ENABLED);
}

absl::StatusOr<Library::Bar1Memory> Library::Bar1(Device d) const {
  nvmlBAR1Memory_t m{};
  if (auto st = KGPU_CALL(nvmlDeviceGetBAR1MemoryInfo, H(d), &m); !st.ok()) return st;
  return Bar1Memory{m.bar1Total, m.bar1Used, m.bar1Free};
}

absl::StatusOr<bool> Library::PersistenceMode(Device d) const {
  nvmlEnableState_t mode = NVML_FEATURE_DISABLED;
  if (auto st = KGPU_CALL(nvmlDeviceGetPersistenceMode, H(d), &mode); !st.ok()) return st;
  return mode == NVML_FEATURE_ENABLED;
}

absl::StatusOr<std::string> Library::Serial(Device d) const {
  char buf[NVML_DEVICE_SERIAL_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetSerial, H(d), buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<std::string> Library::VbiosVersion(Device d) const {
  char buf[NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetVbiosVersion, H(d), buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<int> Library::Brand(Device d) const {
  nvmlBrandType_t brand = NVML_BRAND_UNKNOWN;
  if (auto st = KGPU_CALL(nvmlDeviceGetBrand, H(d), &brand); !st.ok()) return st;
  return static_cast<int>(brand);
}

absl::StatusOr<unsigned> Library::Architecture(Device d) const {
  nvmlDeviceArchitecture_t arch = NVML_DEVICE_ARCH_UNKNOWN;
  if (auto st = KGPU_CALL(nvmlDeviceGetArchitecture, H(d), &arch); !st.ok()) return st;
  return static_cast<unsigned>(arch);
}

absl::StatusOr<std::string> Library::InforomVersion(Device d, Inforom object) const {
  char buf[NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetInforomVersion, H(d), static_cast<nvmlInforomObject_t>(object), buf, sizeof buf);
      !st.ok()) {
    return st;
  }
  return std::string(buf);
}

absl::StatusOr<std::string> Library::InforomImageVersion(Device d) const {
  char buf[NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE] = {};
  if (auto st = KGPU_CALL(nvmlDeviceGetInforomImageVersion, H(d), buf, sizeof buf); !st.ok()) return st;
  return std::string(buf);
}

absl::StatusOr<int> Library::P2PStatus(Device a, Device b, P2PCaps caps) const {
  nvmlGpuP2PStatus_t status = NVML_P2P_STATUS_UNKNOWN;
  if (auto st = KGPU_CALL(nvmlDeviceGetP2PStatus, H(a), H(b), static_cast<nvmlGpuP2PCapsIndex_t>(caps), &status);
      !st.ok()) {
    return st;
  }
  return static_cast<int>(status);
}

absl::StatusOr<bool> Library::GpmSupported(Device gpu) const {
  nvmlGpmSupport_t support{};
  support.version = NVML_GPM_SUPPORT_VERSION;
  auto st = KGPU_CALL(nvmlGpmQueryDeviceSupport, H(gpu), &support);
  // A driver older than GPM (FUNCTION_NOT_FOUND), or a GPU that has none. NO_PERMISSION is not
  // "none": GPM may be restricted to administrators on a GPU that has it, so the caller gets the
  // error (and asks again) instead of a GPU taken for one too old.
  if (IsNoValue(st) && ReturnOf(st) != Return::kNoPermission) return false;
  if (!st.ok()) return st;
  return support.isSupportedDevice != 0;
}

absl::StatusOr<GpmSample> Library::GpmSampleAlloc() const {
  nvmlGpmSample_t sample = nullptr;
  if (auto st = KGPU_CALL(nvmlGpmSampleAlloc, &sample); !st.ok()) return st;
  return GpmSample(this, sample);
}

absl::Status Library::GpmSampleGet(Device gpu, GpmSample& sample) const {
  if (sample.empty()) return absl::FailedPreconditionError("nvmlGpmSampleGet: the sample buffer is empty");
  return KGPU_CALL(nvmlGpmSampleGet, H(gpu), static_cast<nvmlGpmSample_t>(sample.sample_));
}

absl::Status Library::GpmMigSampleGet(Device gpu, unsigned gi, GpmSample& sample) const {
  if (sample.empty()) return absl::FailedPreconditionError("nvmlGpmMigSampleGet: the sample buffer is empty");
  return KGPU_CALL(nvmlGpmMigSampleGet, H(gpu), gi, static_cast<nvmlGpmSample_t>(sample.sample_));
}

absl::StatusOr<std::vector<std::optional<double>>> Library::GpmMetrics(const GpmSample& older, const GpmSample& newer,
                                                                       const std::vector<unsigned>& ids) const {
  if (older.empty() || newer.empty()) {
    return absl::FailedPreconditionError("nvmlGpmMetricsGet: a sample buffer is empty");
  }
  if (ids.size() > NVML_GPM_METRIC_MAX) {
    return absl::InvalidArgumentError(
        Cat("nvmlGpmMetricsGet: ", ids.size(), " metrics asked, at most ", NVML_GPM_METRIC_MAX, " fit in one call"));
  }
  // ~13 KiB: on the heap rather than on the collection thread's stack.
  auto get = std::make_unique<nvmlGpmMetricsGet_t>();
  std::memset(get.get(), 0, sizeof *get);
  get->version = NVML_GPM_METRICS_GET_VERSION;
  get->numMetrics = static_cast<unsigned>(ids.size());
  get->sample1 = static_cast<nvmlGpmSample_t>(older.sample_);
  get->sample2 = static_cast<nvmlGpmSample_t>(newer.sample_);
  for (size_t i = 0; i < ids.size(); ++i) get->metrics[i].metricId = ids[i];
  if (auto st = KGPU_CALL(nvmlGpmMetricsGet, get.get()); !st.ok()) return st;
  std::vector<std::optional<double>> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const nvmlGpmMetric_t& m = get->metrics[i];
    if (m.nvmlReturn == NVML_SUCCESS) {
      out.emplace_back(m.value);
    } else {
      out.emplace_back();
    }
  }
  return out;
}

GpmSample::~GpmSample() {
  if (sample_ != nullptr && lib_ != nullptr && lib_->syms_ && lib_->syms_->nvmlGpmSampleFree != nullptr) {
    lib_->syms_->nvmlGpmSampleFree(static_cast<nvmlGpmSample_t>(sample_));
  }
}

GpmSample& GpmSample::operator=(GpmSample&& other) noexcept {
  if (this != &other) {
    GpmSample old(std::move(*this));  // frees what this held
    lib_ = other.lib_;
    sample_ = other.sample_;
    other.sample_ = nullptr;
  }
  return *this;
}

namespace {
// One of NVML's process lists (same signature for the compute and the MPS-client lists).
template <typename Fn>
absl::StatusOr<std::vector<Library::ProcessInfo>> ProcessList(const Library::Symbols& syms, const char* name, Fn fn,
                                                              nvmlDevice_t d, bool mps_client) {
  std::vector<nvmlProcessInfo_t> infos(16);
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned count = static_cast<unsigned>(infos.size());
    auto st = Call(syms, name, fn, d, &count, infos.data());
    if (ReturnOf(st) == Return::kInsufficientSize) {
      infos.resize(count + 8);  // processes started meanwhile: retry with room to spare
      continue;
    }
    if (!st.ok()) return st;
    std::vector<Library::ProcessInfo> out;
    for (unsigned i = 0; i < count; ++i) {
      out.push_back(
          {infos[i].pid, infos[i].usedGpuMemory, infos[i].gpuInstanceId, infos[i].computeInstanceId, mps_client});
    }
    return out;
  }
  return absl::ResourceExhaustedError(Cat(name, ": the process list keeps growing"));
}
}  // namespace

absl::StatusOr<std::vector<Library::ProcessInfo>> Library::ComputeProcesses(Device d) const {
  auto out = ProcessList(*syms_, "nvmlDeviceGetComputeRunningProcesses", syms_->nvmlDeviceGetComputeRunningProcesses_v3,
                         H(d), false);
  if (!out.ok()) return out;
  // MPS clients are processes of their own (each in its pod's cgroup) with their own memory;
  // drivers without the call, or without MPS, answer "no value".
  auto clients = ProcessList(*syms_, "nvmlDeviceGetMPSComputeRunningProcesses",
                             syms_->nvmlDeviceGetMPSComputeRunningProcesses_v3, H(d), true);
  if (clients.ok()) {
    for (const auto& c : *clients) {
      auto same = std::find_if(out->begin(), out->end(), [&](const ProcessInfo& p) { return p.pid == c.pid; });
      if (same == out->end()) {
        out->push_back(c);
      } else {
        same->mps_client = true;
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<Library::ProcessSample>> Library::ProcessUtilization(Device d, uint64_t last_seen_us) const {
  unsigned count = 0;
  auto st = KGPU_CALL(nvmlDeviceGetProcessUtilization, H(d), nullptr, &count, last_seen_us);
  if (ReturnOf(st) == Return::kNotFound) return std::vector<ProcessSample>{};
  if (!st.ok() && ReturnOf(st) != Return::kInsufficientSize) return st;
  std::vector<nvmlProcessUtilizationSample_t> samples(count + 4);
  count = static_cast<unsigned>(samples.size());
  st = KGPU_CALL(nvmlDeviceGetProcessUtilization, H(d), samples.data(), &count, last_seen_us);
  if (ReturnOf(st) == Return::kNotFound) return std::vector<ProcessSample>{};
  if (!st.ok()) return st;
  std::vector<ProcessSample> out;
  for (unsigned i = 0; i < count; ++i) {
    out.push_back({samples[i].pid, samples[i].smUtil, samples[i].memUtil, samples[i].timeStamp});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<EventSet>> Library::CreateEventSet() const {
  nvmlEventSet_t set = nullptr;
  if (auto st = KGPU_CALL(nvmlEventSetCreate, &set); !st.ok()) return st;
  return std::unique_ptr<EventSet>(new EventSet(*this, set));
}

EventSet::~EventSet() {
  if (lib_.syms_->nvmlEventSetFree != nullptr) {
    lib_.syms_->nvmlEventSetFree(static_cast<nvmlEventSet_t>(set_));
  }
}

absl::Status EventSet::Register(Device device, uint64_t types) const {
  const Library::Symbols& s = *lib_.syms_;
  return Call(s, "nvmlDeviceRegisterEvents", s.nvmlDeviceRegisterEvents, H(device),
              static_cast<unsigned long long>(types), static_cast<nvmlEventSet_t>(set_));
}

absl::StatusOr<std::optional<Event>> EventSet::Wait(unsigned timeout_ms) const {
  const Library::Symbols& s = *lib_.syms_;
  nvmlEventData_t data{};
  auto st = Call(s, "nvmlEventSetWait", s.nvmlEventSetWait_v2, static_cast<nvmlEventSet_t>(set_), &data, timeout_ms);
  if (ReturnOf(st) == Return::kTimeout) return std::optional<Event>();
  if (!st.ok()) return st;
  return std::optional<Event>(
      Event{Device{data.device}, data.eventType, data.eventData, data.gpuInstanceId, data.computeInstanceId});
}

}  // namespace kgpu::nvml
