#include "dra/prepare.h"

#include <algorithm>
#include <deque>
#include <filesystem>

#include "api/dra.h"
#include "common/files.h"
#include "common/log.h"
#include "common/remove_tree.h"
#include "common/strings.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/interposer.h"
#include "dra/slices.h"
#include "k8s/client.h"
#include "k8s/quantity.h"
#include "k8s/resources.h"

namespace kgpu::dra {
namespace {

using json = nlohmann::json;
constexpr uint64_t kMi = uint64_t{1} << 20;

// What a device name of this node's pool is.
struct Target {
  const gpu::Gpu* gpu = nullptr;
  const gpu::MigDevice* mig = nullptr;  // null: the whole GPU
};

std::string Who(const ClaimRef& c) {
  return Cat("ResourceClaim ", c.ns, "/", c.name, " (", c.uid, ")");
}

// A quantity (a capacity as the scheduler wrote it) in whole units, rounded up; nullopt when it
// does not parse or is negative.
std::optional<uint64_t> Units(const json& q) {
  if (!q.is_string()) return std::nullopt;
  const auto v = k8s::Quantity::Parse(q.get<std::string>());
  if (!v || v->milli < 0) return std::nullopt;
  return static_cast<uint64_t>((v->milli + 999) / 1000);
}

}  // namespace

absl::StatusOr<json> ParseCheckpoint(std::string_view text, std::string_view origin) {
  json cp = json::parse(text, nullptr, false);
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(Cat(origin, ": not a kgpu DRA checkpoint (version 1): ", what));
  };
  if (cp.is_discarded() || !cp.is_object()) return bad("not a JSON object");
  if (!cp.contains("version") || cp["version"] != 1) return bad("no version 1");
  if (!cp.contains("claims") || !cp["claims"].is_object()) return bad("no claims object");
  auto strings = [](const json& o, const char* key) {
    if (!o.contains(key)) return true;
    if (!o[key].is_array()) return false;
    return std::all_of(o[key].begin(), o[key].end(), [](const json& x) { return x.is_string(); });
  };
  for (const auto& [uid, c] : cp["claims"].items()) {
    const std::string at = Cat("claims[", uid, "]");
    if (!c.is_object()) return bad(Cat(at, " is not an object"));
    for (const char* k : {"namespace", "name", "spec"}) {
      if (c.contains(k) && !c[k].is_string()) return bad(Cat(at, ".", k, " is not a string"));
    }
    if (!strings(c, "regions")) return bad(Cat(at, ".regions is not a list of strings"));
    if (c.contains("devices")) {
      if (!c["devices"].is_array()) return bad(Cat(at, ".devices is not a list"));
      for (const auto& d : c["devices"]) {
        if (!d.is_object() || !strings(d, "requests") || !strings(d, "cdi_ids")) {
          return bad(Cat(at, ".devices: an entry is not {requests, pool, device, cdi_ids, share_id}"));
        }
        for (const char* k : {"pool", "device", "share_id"}) {
          if (d.contains(k) && !d[k].is_string()) return bad(Cat(at, ".devices[].", k, " is not a string"));
        }
      }
    }
    if (c.contains("carved")) {
      if (!c["carved"].is_array()) return bad(Cat(at, ".carved is not a list"));
      for (const auto& m : c["carved"]) {
        if (!m.is_object() || !m.contains("gpu") || !m["gpu"].is_string() || !m.contains("gi") ||
            !m["gi"].is_number_unsigned() || (m.contains("profile") && !m["profile"].is_number_unsigned()) ||
            (m.contains("start") && !m["start"].is_number_unsigned())) {
          return bad(Cat(at, ".carved: an entry is not {gpu, gi, profile, start}"));
        }
      }
    }
  }
  return cp;
}

Preparer::Preparer(std::shared_ptr<k8s::Client> client, std::shared_ptr<const gpu::Inventory> inventory,
                   PrepareOptions options, std::shared_ptr<const nvml::Library> lib)
    : client_(std::move(client)), inventory_(std::move(inventory)), opts_(std::move(options)), lib_(std::move(lib)) {}

absl::StatusOr<std::unique_ptr<Preparer>> Preparer::Create(std::shared_ptr<k8s::Client> client,
                                                           std::shared_ptr<const gpu::Inventory> inventory,
                                                           PrepareOptions options,
                                                           std::shared_ptr<const nvml::Library> lib) {
  if (options.dynamic_mig && !lib) return absl::InvalidArgumentError("dynamic MIG needs the NVML library");
  std::unique_ptr<Preparer> p(
      new Preparer(std::move(client), std::move(inventory), std::move(options), std::move(lib)));
  const std::string path = Cat(p->opts_.plugin_dir, "/checkpoint.json");
  p->checkpoint_ = {{"version", 1}, {"claims", json::object()}};
  if (const auto text = ReadFile(path)) {
    auto cp = ParseCheckpoint(*text, path);
    if (!cp.ok()) {
      return absl::DataLossError(Cat(cp.status().message(),
                                     "; the claims it recorded cannot be unprepared. Move it "
                                     "aside after unpreparing them by hand (CDI specs in ",
                                     p->opts_.cdi_dir, ", accounting regions in ", p->opts_.cuda_shared_root, "/dra)"));
    }
    p->checkpoint_ = std::move(*cp);
  }
  if (p->opts_.dynamic_mig) {
    // The driver owns MIG on MIG-mode GPUs: a GPU instance no prepared claim carved goes.
    std::set<std::string> kept;  // "<gpu uuid>/<gi id>"
    for (const auto& [uid, c] : p->checkpoint_["claims"].items()) {
      for (const auto& m : c.value("carved", json::array()))
        kept.insert(Cat(m.value("gpu", ""), "/", m.value("gi", 0)));
    }
    for (const auto& g : p->inventory_->gpus()) {
      if (!g.mig_enabled || !g.error.empty()) continue;
      auto gis = p->lib_->GpuInstances(g.handle);
      if (!gis.ok()) return absl::Status(gis.status().code(), Cat("GPU ", g.index, ": ", gis.status().message()));
      for (const auto& gi : *gis) {
        if (kept.contains(Cat(g.uuid, "/", gi.id))) continue;
        Log("dra")->warn(
            "GPU {}: destroying GPU instance {} (no prepared claim carved it; --dynamic-mig owns MIG here)", g.index,
            gi.id);
        if (auto st = p->DestroyCarved({{"gpu", g.uuid}, {"gi", gi.id}}); !st.ok()) return st;
      }
    }
  }
  return p;
}

absl::StatusOr<gpu::MigDevice> Preparer::Carve(const gpu::Gpu& g, const std::string& name, json& record) {
  const auto cat = opts_.mig.find(g.index);
  if (cat == opts_.mig.end()) return absl::FailedPreconditionError(Cat("GPU ", g.index, " has no MIG profiles"));
  for (const auto& p : cat->second.profiles) {
    for (const auto& pl : p.placements) {
      if (api::dra::MigDeviceName(g.minor, p.name, p.profile.id, pl.start) != name) continue;
      auto gi = lib_->CreateGpuInstance(g.handle, p.profile, pl);
      if (!gi.ok()) {
        return absl::Status(gi.status().code(), Cat("carving ", p.name, " at memory slice ", pl.start, " on GPU ",
                                                    g.index, ": ", gi.status().message()));
      }
      record["carved"].push_back({{"gpu", g.uuid}, {"gi", gi->id}, {"profile", p.profile.id}, {"start", pl.start}});
      if (auto st = lib_->CreateFullComputeInstance(*gi, p.profile.slices); !st.ok()) {
        return absl::Status(st.code(),
                            Cat("the compute instance of ", p.name, " on GPU ", g.index, ": ", st.message()));
      }
      auto migs = lib_->MigDevices(g.handle);
      if (!migs.ok()) return migs.status();
      for (const auto& m : *migs) {
        if (m.gi != gi->id) continue;
        auto uuid = lib_->Uuid(m.handle);
        if (!uuid.ok()) return uuid.status();
        gpu::MigDevice d;
        d.uuid = *uuid;
        d.parent = g.index;
        d.gi = m.gi;
        d.ci = m.ci;
        d.profile = p.name;
        d.memory_mib = m.memory_mib;
        return d;
      }
      return absl::InternalError(
          Cat("GPU ", g.index, ": the GPU instance ", gi->id, " carved for ", name, " has no MIG device"));
    }
  }
  return absl::NotFoundError(Cat("GPU ", g.index, " offers no MIG placement named ", name));
}

absl::Status Preparer::DestroyCarved(const json& carved) {
  const std::string uuid = carved.value("gpu", "");
  const unsigned id = carved.value("gi", 0U);
  const gpu::Gpu* g = inventory_->FindGpu(uuid);
  if (g == nullptr || !lib_) return absl::OkStatus();  // the GPU is gone: nothing to destroy
  auto gis = lib_->GpuInstances(g->handle);
  if (!gis.ok()) return gis.status();
  for (const auto& gi : *gis) {
    // The same GPU instance, not one that reuses its id (after a reset): its profile and placement
    // must match what was carved.
    if (gi.id != id) continue;
    if (carved.contains("profile") &&
        (gi.profile_id != carved.value("profile", 0U) || gi.placement.start != carved.value("start", 0U))) {
      continue;
    }
    auto cis = lib_->ComputeInstances(gi);
    if (!cis.ok()) return cis.status();
    for (void* ci : *cis) {
      if (auto st = lib_->DestroyComputeInstance(ci); !st.ok()) {
        return absl::Status(st.code(), Cat("GPU ", g->index, " GPU instance ", id, ": ", st.message()));
      }
    }
    if (auto st = lib_->DestroyGpuInstance(gi); !st.ok()) {
      return absl::Status(st.code(), Cat("GPU ", g->index, " GPU instance ", id, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

std::string Preparer::CdiKind() const {
  return Cat("k8s.", opts_.driver, "/claim");
}

std::string Preparer::SpecPath(const std::string& uid) const {
  return Cat(opts_.cdi_dir, "/k8s.", opts_.driver, "-claim_", uid, ".json");
}

std::vector<std::string> Preparer::Prepared() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [uid, c] : checkpoint_["claims"].items()) out.push_back(uid);
  return out;
}

absl::Status Preparer::Save() {
  std::error_code ec;
  std::filesystem::create_directories(opts_.plugin_dir, ec);
  const std::string path = Cat(opts_.plugin_dir, "/checkpoint.json");
  if (auto st = WriteFileAtomically(path, checkpoint_.dump(2) + "\n", 0600); !st.ok()) {
    return absl::UnavailableError(Cat("the checkpoint ", path, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PreparedDevice>> Preparer::Prepare(const ClaimRef& claim) {
  std::lock_guard lock(mu_);
  json& claims = checkpoint_["claims"];
  if (claims.contains(claim.uid)) {
    // Prepared before (kubelet retries, or asks again after a restart): the same answer.
    std::vector<PreparedDevice> out;
    for (const auto& d : claims[claim.uid].value("devices", json::array())) {
      out.push_back({d.value("requests", std::vector<std::string>{}), d.value("pool", ""), d.value("device", ""),
                     d.value("cdi_ids", std::vector<std::string>{}), d.value("share_id", "")});
    }
    return out;
  }
  json record = {{"namespace", claim.ns}, {"name", claim.name}, {"regions", json::array()}, {"carved", json::array()}};
  absl::StatusOr<std::vector<PreparedDevice>> devices;
  try {
    devices = PrepareLocked(claim, record);
  } catch (const json::exception& e) {
    // A field of the claim (its opaque parameters are the user's JSON) of another type than the API's.
    devices = absl::InvalidArgumentError(Cat(Who(claim), ": a field of the claim is malformed: ", e.what()));
  }
  if (!devices.ok()) {
    // Nothing half-made stays behind: the spec, the regions and the MIG instances made so far go.
    std::error_code ec;
    std::filesystem::remove(SpecPath(claim.uid), ec);
    for (const auto& r : record["regions"]) (void)RemoveTreeNoFollow(r.get<std::string>());
    for (const auto& m : record["carved"]) (void)DestroyCarved(m);
    return devices.status();
  }
  json list = json::array();
  for (const auto& d : *devices) {
    list.push_back({{"requests", d.requests},
                    {"pool", d.pool},
                    {"device", d.device},
                    {"cdi_ids", d.cdi_ids},
                    {"share_id", d.share_id}});
  }
  record["devices"] = std::move(list);
  record["spec"] = SpecPath(claim.uid);
  claims[claim.uid] = record;
  if (auto st = Save(); !st.ok()) {
    // Unrecorded, so nothing of it may stay: what a later unprepare could not find.
    claims.erase(claim.uid);
    std::error_code ec;
    std::filesystem::remove(SpecPath(claim.uid), ec);
    for (const auto& r : record["regions"]) (void)RemoveTreeNoFollow(r.get<std::string>());
    for (const auto& m : record["carved"]) (void)DestroyCarved(m);
    return st;
  }
  return devices;
}

absl::StatusOr<std::vector<PreparedDevice>> Preparer::PrepareLocked(const ClaimRef& claim, json& record) {
  const std::string who = Who(claim);
  const k8s::Resource* rc = k8s::FindResource("resourceclaims");
  auto got = client_->Get(rc->Path(claim.ns, claim.name));
  if (!got.ok()) return absl::Status(got.status().code(), Cat(who, ": ", got.status().message()));
  const json& obj = *got;
  const std::string uid = k8s::Field(obj, "metadata").value("uid", "");
  if (uid != claim.uid) {
    return absl::FailedPreconditionError(Cat(who, ": the claim got replaced (its UID is now ", uid, ")"));
  }
  const json& allocation = k8s::Field(k8s::Field(obj, "status"), "allocation");
  if (allocation.empty()) return absl::FailedPreconditionError(Cat(who, ": the claim is not allocated"));
  // Opaque configuration for this driver: kgpu enforces what the allocation says; a configuration
  // it would have to honour and does not is refused rather than ignored.
  for (const auto& c : k8s::Field(allocation, "devices").value("config", json::array())) {
    const json& opaque = k8s::Field(c, "opaque");
    if (!opaque.contains("driver") || opaque["driver"] != opts_.driver) continue;
    const json& params = k8s::Field(opaque, "parameters");
    const json& sharing = k8s::Field(params, "sharing");
    if (!sharing.is_object() || (sharing.contains("strategy") && !sharing["strategy"].is_string())) {
      return absl::InvalidArgumentError(Cat(who, ": its configuration for ", opts_.driver,
                                            " has a sharing that is not {strategy: <name>}: ", sharing.dump()));
    }
    const std::string strategy = sharing.value("strategy", "");
    if (!sharing.empty() && strategy != "TimeSlicing") {
      return absl::UnimplementedError(
          Cat(who, ": its ",
              params.contains("kind") && params["kind"].is_string() ? params["kind"].get<std::string>()
                                                                    : std::string("configuration"),
              " asks for sharing strategy '", strategy,
              "', which kgpu's DRA driver does not provide; ask for a share through the ", api::dra::kShareClass,
              " class (capacity memory and cores), which kgpu enforces"));
    }
  }
  // The devices of this node's pool.
  std::map<std::string, Target> targets;
  for (const auto& g : inventory_->gpus()) {
    if (!g.mig_enabled) {
      targets[api::dra::GpuDeviceName(g.minor)] = {&g, nullptr};
      continue;
    }
    // With dynamic MIG the instances of the start-up snapshot are gone (Create destroyed them, and
    // unprepare destroys what it carved): every MIG device is carved for its claim.
    const auto cat = opts_.mig.find(g.index);
    if (cat == opts_.mig.end() || opts_.dynamic_mig) continue;
    for (const auto& m : g.migs) {
      if (const std::string name = StaticMigName(g, m, cat->second); !name.empty()) targets[name] = {&g, &m};
    }
  }
  json spec_devices = json::array();
  std::map<std::string, deviceplugin::InterposerLimit> limits;  // GPU UUID -> the claim's shares of it
  std::vector<size_t> shared_devices;                           // spec_devices held by the interposer
  std::map<std::string, int> names_seen;
  std::deque<gpu::MigDevice> carved;  // the facts of instances carved for this claim (targets point here)
  std::vector<PreparedDevice> out;
  std::vector<std::string> uuids;
  for (const auto& r : k8s::Field(allocation, "devices").value("results", json::array())) {
    if (r.value("driver", "") != opts_.driver) continue;
    const std::string pool = r.value("pool", ""), device = r.value("device", "");
    if (pool != opts_.node_name) {
      return absl::FailedPreconditionError(Cat(who, ": device ", device, " was allocated from pool ", pool,
                                               ", not this node's (", opts_.node_name, ")"));
    }
    auto t = targets.find(device);
    if (t == targets.end() && opts_.dynamic_mig && device.find("-mig-") != std::string::npos) {
      // "gpu-<minor>-mig-...": carve it on its parent.
      const gpu::Gpu* parent = nullptr;
      for (const auto& g : inventory_->gpus()) {
        if (g.mig_enabled && device.rfind(Cat(api::dra::GpuDeviceName(g.minor), "-mig-"), 0) == 0) parent = &g;
      }
      if (parent != nullptr) {
        auto m = Carve(*parent, device, record);
        if (!m.ok()) return absl::Status(m.status().code(), Cat(who, ": ", m.status().message()));
        carved.push_back(*m);
        t = targets.emplace(device, Target{parent, &carved.back()}).first;
      }
    }
    if (t == targets.end()) {
      return absl::FailedPreconditionError(
          Cat(who, ": this node has no device ", device,
              device.find("-mig-") != std::string::npos
                  ? " (a MIG instance that does not exist, and the driver runs without --dynamic-mig)"
                  : " (its GPUs changed since the slice was published)"));
    }
    const gpu::Gpu& g = *t->second.gpu;
    const std::string uuid = t->second.mig ? t->second.mig->uuid : g.uuid;
    uuids.push_back(uuid);
    json nodes = json::array();
    auto node = [&](const std::string& p) { return json{{"path", p}, {"hostPath", UnderRoot(opts_.dev_root, p)}}; };
    nodes.push_back(node(Cat("/dev/nvidia", g.minor)));
    for (const char* n : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) nodes.push_back(node(n));
    if (t->second.mig) {
      const auto caps = gpu::MigCapNodes(opts_.mig_minors, g.minor, t->second.mig->gi, t->second.mig->ci);
      if (caps.empty()) {
        return absl::FailedPreconditionError(Cat(who, ": MIG device ", uuid,
                                                 " has no capability minors in the driver's mig-minors file "
                                                 "(mount the host's /proc/driver/nvidia-caps, --proc-root)"));
      }
      for (const auto& c : caps) nodes.push_back(node(c));
    }
    json edits = {{"deviceNodes", nodes}, {"env", json::array()}};
    // A share: the capacity the scheduler booked for this claim, held by the CUDA interposer.
    const json& consumed = k8s::Field(r, "consumedCapacity");
    if (!consumed.empty() || !r.value("shareID", "").empty()) {
      if (!opts_.shared_gpus.contains(g.index) || t->second.mig) {
        return absl::FailedPreconditionError(
            Cat(who, ": device ", device, " was allocated as a share, but this node does not offer it for sharing"));
      }
      const auto memory = consumed.contains(api::dra::kCapMemory) ? Units(consumed[api::dra::kCapMemory])
                                                                  : std::optional<uint64_t>(g.memory_mib * kMi);
      const auto cores =
          consumed.contains(api::dra::kCapCores) ? Units(consumed[api::dra::kCapCores]) : std::optional<uint64_t>(100);
      if (!memory || !cores || *cores > 100) {
        return absl::InvalidArgumentError(Cat(who, ": device ", device, ": consumedCapacity ", consumed.dump(),
                                              " is not memory bytes and cores 0-100"));
      }
      const uint64_t memory_mib = (*memory + kMi - 1) / kMi;
      if (memory_mib < g.memory_mib || *cores < 100) {
        if (opts_.cuda_interposer.empty()) {
          return absl::FailedPreconditionError(
              Cat(who, ": device ", device, " is a share (", memory_mib, " MiB, ", *cores,
                  "% of the SMs) but this node has no CUDA interposer (--cuda-interposer), so nothing would hold the "
                  "claim to it; it is not started unlimited"));
        }
        // Several shares of one claim (on several GPUs, or twice on one): one accounting region for
        // the claim with every GPU's limit, a share of one GPU twice summed.
        auto& l = limits[uuid];
        l.uuid = uuid;
        l.memory_mib += memory_mib;
        l.cores = std::min<int64_t>(100, l.cores + static_cast<int64_t>(*cores));
        shared_devices.push_back(spec_devices.size());
      }
    }
    // A device allocated twice in one claim (two shares of one GPU) gets a CDI device each.
    const int seen = ++names_seen[device];
    const std::string cdi_name = seen == 1 ? Cat(claim.uid, "-", device) : Cat(claim.uid, "-", device, "-", seen);
    spec_devices.push_back({{"name", cdi_name}, {"containerEdits", edits}});
    std::string request = r.value("request", "");
    if (const auto slash = request.find('/'); slash != std::string::npos) request.resize(slash);
    out.push_back({{request}, pool, device, {Cat(CdiKind(), "=", cdi_name)}, r.value("shareID", "")});
  }
  if (!limits.empty()) {
    // The claim's shares held by the CUDA interposer: one region, every limit; the same edits on
    // each share device, so a container given any of them is held to all (CDI merges equal values).
    const std::string region = Cat(opts_.cuda_shared_root, "/dra/", claim.uid);
    record["regions"].push_back(region);
    std::vector<deviceplugin::InterposerLimit> all;
    std::vector<std::string> memory, core;
    for (const auto& [uuid, l] : limits) {
      all.push_back(l);
      memory.push_back(Cat(uuid, "=", l.memory_mib, "Mi"));
      if (l.cores < 100) core.push_back(Cat(uuid, "=", l.cores));
    }
    auto iso = deviceplugin::InterposerEditsFor(opts_.cuda_interposer, opts_.cuda_interposer_load,
                                                opts_.cuda_shared_root, region, all);
    if (!iso.ok()) return absl::Status(iso.status().code(), Cat(who, ": ", iso.status().message()));
    json env = {"KGPU_ENFORCEMENT=hard", Cat("KGPU_CUDA_MEMORY_LIMIT=", Join(memory, ","))};
    if (!core.empty()) env.push_back(Cat("KGPU_CUDA_CORE_LIMIT=", Join(core, ",")));
    if (limits.size() == 1) env.push_back(Cat("KGPU_GPU_CORES=", limits.begin()->second.cores));
    for (const auto& [k, v] : iso->envs) env.push_back(Cat(k, "=", v));
    for (size_t i : shared_devices) {
      auto& e = spec_devices[i]["containerEdits"];
      for (const auto& x : env) e["env"].push_back(x);
      e["mounts"] = deviceplugin::CdiMounts(iso->mounts);
    }
  }
  // NVIDIA_VISIBLE_DEVICES names every GPU of the claim, on each of its CDI devices (a container
  // gets some or all of them; CDI applies the same value once).
  for (auto& d : spec_devices) {
    d["containerEdits"]["env"].push_back(Cat("NVIDIA_VISIBLE_DEVICES=", Join(uuids, ",")));
  }
  if (!out.empty()) {
    const json spec = {{"cdiVersion", "0.5.0"}, {"kind", CdiKind()}, {"devices", spec_devices}};
    std::error_code ec;
    std::filesystem::create_directories(opts_.cdi_dir, ec);
    if (auto st = WriteFileAtomically(SpecPath(claim.uid), spec.dump(2) + "\n"); !st.ok()) {
      return absl::UnavailableError(
          Cat(who, ": the CDI spec: ", st.message(), " (mount the CDI spec directory, or change --cdi-spec-dir)"));
    }
  }
  return out;
}

absl::Status Preparer::Unprepare(const ClaimRef& claim) {
  std::lock_guard lock(mu_);
  json& claims = checkpoint_["claims"];
  if (!claims.contains(claim.uid)) return absl::OkStatus();  // never prepared here, or already undone
  const json record = claims[claim.uid];
  // The MIG instances and regions first, the spec last: a claim whose instance cannot be destroyed
  // yet (still busy) stays prepared with its spec, and the next unprepare tries again.
  for (const auto& m : record.value("carved", json::array())) {
    // Carved for this claim and used by nothing else (a claim's devices are its own): destroyed.
    if (auto st = DestroyCarved(m); !st.ok()) {
      return absl::UnavailableError(Cat(Who(claim), ": destroying the MIG instance carved for it: ", st.message()));
    }
  }
  for (const auto& r : record.value("regions", json::array())) {
    if (auto st = RemoveTreeNoFollow(r.get<std::string>()); !st.ok()) {
      return absl::UnavailableError(Cat(Who(claim), ": removing its accounting region: ", st.message()));
    }
  }
  std::error_code ec;
  std::filesystem::remove(record.value("spec", SpecPath(claim.uid)), ec);
  if (ec) return absl::UnavailableError(Cat(Who(claim), ": removing its CDI spec: ", ec.message()));
  claims.erase(claim.uid);
  if (auto st = Save(); !st.ok()) {
    claims[claim.uid] = record;
    return st;
  }
  return absl::OkStatus();
}

}  // namespace kgpu::dra
