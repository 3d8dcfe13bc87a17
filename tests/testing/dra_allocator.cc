#include "testing/dra_allocator.h"

#include <random>
#include <set>

#include "common/strings.h"
#include "k8s/quantity.h"
#include "k8s/resources.h"
#include "testing/dra_cel.h"

namespace kgpu::testing {
namespace {

using json = nlohmann::json;

struct Dev {
  std::string driver, pool, name;
  const json* spec = nullptr;  // the slice's device entry
  std::string key() const { return Cat(driver, "/", pool, "/", name); }
};

std::optional<int64_t> Milli(const json& q) {
  if (!q.is_string()) return std::nullopt;
  const auto v = k8s::Quantity::Parse(q.get<std::string>());
  return v ? std::optional<int64_t>(v->milli) : std::nullopt;
}

std::string Canonical(int64_t milli) {
  k8s::Quantity q;
  q.milli = milli;
  q.binary = milli % (1024 * 1000) == 0 && milli != 0;
  return q.Canonical();
}

// An attribute's value for constraints, by fully qualified name.
std::optional<json> AttributeOf(const Dev& d, const std::string& qualified) {
  const json& attrs = k8s::Field(*d.spec, "attributes");
  if (attrs.contains(qualified)) return attrs[qualified];
  const size_t slash = qualified.find('/');
  if (slash != std::string::npos && qualified.substr(0, slash) == d.driver &&
      attrs.contains(qualified.substr(slash + 1))) {
    return attrs[qualified.substr(slash + 1)];
  }
  return std::nullopt;
}

std::string Uuid() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const uint64_t a = rng(), b = rng();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xfff),
                static_cast<unsigned>(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

struct Alternative {
  std::string name;  // "req" or "req/sub"
  const json* spec;  // exactly, or the subrequest
};

class Search {
 public:
  Search(std::vector<Dev> devices,
         std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> counters,
         std::set<std::string> used, std::map<std::string, std::map<std::string, int64_t>> consumed,
         const DraWorld& world, const json& claim)
      : devices_(std::move(devices)),
        counters_(std::move(counters)),
        used_(std::move(used)),
        consumed_(std::move(consumed)),
        world_(world),
        claim_(claim) {}

  absl::StatusOr<bool> Run(const std::vector<std::vector<Alternative>>& requests) {
    requests_ = &requests;
    return Request(0);
  }
  struct Pick {
    std::string request;
    const Dev* dev;
    std::map<std::string, int64_t> consumed;  // capacity name -> milli (multi-allocatable only)
  };
  const std::vector<Pick>& picks() const { return picks_; }
  std::string why;  // the last reason a device was not eligible, for the error

 private:
  absl::StatusOr<bool> Request(size_t i) {
    if (i == requests_->size()) return true;
    for (const auto& alt : (*requests_)[i]) {
      if (alt.spec->value("allocationMode", "ExactCount") == "All") {
        return absl::UnimplementedError(Cat("request ", alt.name, ": allocationMode All is not done by the stand-in"));
      }
      auto r = Device(i, alt, alt.spec->value("count", int64_t{1}), 0, 0);
      if (!r.ok() || *r) return r;
    }
    return false;
  }

  // Picks the next device of `alt` from devices_[from...]; `have` picked so far.
  absl::StatusOr<bool> Device(size_t i, const Alternative& alt, int64_t count, size_t from, int64_t have) {
    if (have == count) return Request(i + 1);
    for (size_t k = from; k < devices_.size(); ++k) {
      auto ok = Eligible(alt, devices_[k]);
      if (!ok.ok()) return ok.status();
      if (!ok->has_value()) continue;
      Take(alt.name, &devices_[k], **ok);
      auto r = Device(i, alt, count, k + 1, have + 1);
      if (!r.ok() || *r) return r;
      Undo();
    }
    return false;
  }

  absl::StatusOr<bool> Selected(const json& selectors, const Dev& d, const std::string& what) {
    for (size_t s = 0; s < selectors.size(); ++s) {
      const std::string expr = k8s::Field(selectors[s], "cel").value("expression", "");
      auto prog = CompileCel(expr);
      if (!prog.ok()) return absl::InvalidArgumentError(Cat(what, " selector ", s, ": ", prog.status().message()));
      auto v = EvalCel(**prog, {d.driver, *d.spec});
      if (!v.ok()) {
        return absl::InvalidArgumentError(
            Cat(what, " selector ", s, " on device ", d.key(), ": CEL runtime error: ", v.status().message()));
      }
      if (!*v) return false;
    }
    return true;
  }

  absl::StatusOr<bool> Matches(const Alternative& alt, const Dev& d) {
    const std::string cls = alt.spec->value("deviceClassName", "");
    const auto c = world_.classes.find(cls);
    if (c == world_.classes.end()) return absl::FailedPreconditionError(Cat("DeviceClass ", cls, " not found"));
    auto by_class = Selected(k8s::Field(c->second, "spec").value("selectors", json::array()), d, Cat("class ", cls));
    if (!by_class.ok() || !*by_class) return by_class;
    return Selected(alt.spec->value("selectors", json::array()), d,
                    Cat("claim ", k8s::Field(claim_, "metadata").value("name", ""), " request ", alt.name));
  }

  // nullopt: not eligible; else what it consumes of a multi-allocatable device's capacity.
  absl::StatusOr<std::optional<std::map<std::string, int64_t>>> Eligible(const Alternative& alt, const Dev& d) {
    auto m = Matches(alt, d);
    if (!m.ok()) return m.status();
    if (!*m) return std::optional<std::map<std::string, int64_t>>();
    const bool multi = d.spec->value("allowMultipleAllocations", false);
    std::set<std::string> picked;
    for (const auto& p : picks_) picked.insert(p.dev->key());
    if (!multi && (used_.contains(d.key()) || picked.contains(d.key()))) {
      why = Cat(d.key(), " is in use");
      return std::optional<std::map<std::string, int64_t>>();
    }
    // Taints.
    for (const auto& t : d.spec->value("taints", json::array())) {
      const std::string effect = t.value("effect", "");
      if (effect != "NoSchedule" && effect != "NoExecute") continue;
      bool tolerated = false;
      for (const auto& tol : alt.spec->value("tolerations", json::array())) {
        const std::string op = tol.value("operator", "Equal"), key = tol.value("key", "");
        const bool key_ok = (key.empty() && op == "Exists") || key == t.value("key", "");
        const bool value_ok = op == "Exists" || tol.value("value", "") == t.value("value", "");
        const bool effect_ok = tol.value("effect", "").empty() || tol.value("effect", "") == effect;
        tolerated = tolerated || (key_ok && value_ok && effect_ok);
      }
      if (!tolerated) {
        why = Cat(d.key(), " has taint ", t.value("key", ""), "=", t.value("value", ""), ":", effect);
        return std::optional<std::map<std::string, int64_t>>();
      }
    }
    // Counters.
    for (const auto& c : d.spec->value("consumesCounters", json::array())) {
      auto& left = counters_[Cat(d.driver, "/", d.pool)][c.value("counterSet", "")];
      for (const auto& [name, v] : k8s::Field(c, "counters").items()) {
        const auto need = Milli(v.value("value", json()));
        if (!need || left[name] < *need) {
          why = Cat(d.key(), ": counter ", c.value("counterSet", ""), "/", name, " exhausted");
          return std::optional<std::map<std::string, int64_t>>();
        }
      }
    }
    // Capacity.
    const json& caps = k8s::Field(*d.spec, "capacity");
    const json& requests = k8s::Field(k8s::Field(*alt.spec, "capacity"), "requests");
    std::map<std::string, int64_t> consume;
    for (const auto& [rname, rq] : requests.items()) {
      std::string cname = rname;
      if (const size_t slash = cname.find('/'); slash != std::string::npos && cname.substr(0, slash) == d.driver) {
        cname = cname.substr(slash + 1);
      }
      if (!caps.contains(cname)) {
        why = Cat(d.key(), " has no capacity ", rname);
        return std::optional<std::map<std::string, int64_t>>();
      }
      if (!multi && Milli(caps[cname].value("value", json())).value_or(0) < Milli(rq).value_or(0)) {
        why = Cat(d.key(), ": capacity ", cname, " below the request");
        return std::optional<std::map<std::string, int64_t>>();
      }
    }
    if (!multi) return std::optional<std::map<std::string, int64_t>>(consume);
    for (const auto& [cname, cap] : caps.items()) {
      const int64_t value = Milli(cap.value("value", json())).value_or(0);
      const json& policy = k8s::Field(cap, "requestPolicy");
      std::optional<int64_t> want;
      if (requests.contains(cname)) want = Milli(requests[cname]);
      if (!want && requests.contains(Cat(d.driver, "/", cname))) want = Milli(requests[Cat(d.driver, "/", cname)]);
      int64_t amount = value;
      if (!want) {
        if (policy.contains("default")) amount = Milli(policy["default"]).value_or(value);
      } else {
        amount = *want;
        if (const json& range = k8s::Field(policy, "validRange"); !range.empty()) {
          const int64_t min = Milli(range.value("min", json())).value_or(0);
          if (amount < min) amount = min;
          if (const auto step = Milli(range.value("step", json())); step && *step > 0) {
            amount = min + (amount - min + *step - 1) / *step * *step;
          }
          if (const auto max = Milli(range.value("max", json())); max && amount > *max) {
            why = Cat(d.key(), ": ", cname, " request above the policy's max");
            return std::optional<std::map<std::string, int64_t>>();
          }
        } else if (policy.contains("validValues")) {
          std::optional<int64_t> pick;
          for (const auto& v : policy["validValues"]) {
            const auto x = Milli(v);
            if (x && *x >= amount && (!pick || *x < *pick)) pick = x;
          }
          if (!pick) {
            why = Cat(d.key(), ": ", cname, " request above every valid value");
            return std::optional<std::map<std::string, int64_t>>();
          }
          amount = *pick;
        }
      }
      int64_t already = consumed_[d.key()][cname];
      for (const auto& p : picks_) {
        if (p.dev->key() == d.key() && p.consumed.contains(cname)) already += p.consumed.at(cname);
      }
      if (already + amount > value) {
        why = Cat(d.key(), ": ", cname, " has ", Canonical(value - already), " left, the claim needs ",
                  Canonical(amount));
        return std::optional<std::map<std::string, int64_t>>();
      }
      consume[cname] = amount;
    }
    // Constraints of the claim that cover this request.
    const std::string request = alt.name.substr(0, alt.name.find('/'));
    for (const auto& c : k8s::Field(k8s::Field(claim_, "spec"), "devices").value("constraints", json::array())) {
      const json reqs = c.value("requests", json::array());
      auto covers = [&](const std::string& name) {
        if (reqs.empty()) return true;
        for (const auto& r : reqs) {
          const std::string s = r.get<std::string>();
          if (s == name || s == name.substr(0, name.find('/'))) return true;
        }
        return false;
      };
      if (!covers(alt.name) && !covers(request)) continue;
      const std::string match = c.value("matchAttribute", ""), distinct = c.value("distinctAttribute", "");
      const std::string attr = match.empty() ? distinct : match;
      const auto mine = AttributeOf(d, attr);
      for (const auto& p : picks_) {
        if (!covers(p.request)) continue;
        const auto theirs = AttributeOf(*p.dev, attr);
        if (!match.empty() && (!mine || !theirs || *mine != *theirs)) {
          why = Cat(d.key(), ": ", attr, " does not match");
          return std::optional<std::map<std::string, int64_t>>();
        }
        if (!distinct.empty() && mine && theirs && *mine == *theirs) {
          why = Cat(d.key(), ": ", attr, " is not distinct");
          return std::optional<std::map<std::string, int64_t>>();
        }
      }
      if (!match.empty() && !mine) {
        why = Cat(d.key(), " has no attribute ", attr);
        return std::optional<std::map<std::string, int64_t>>();
      }
    }
    return std::optional<std::map<std::string, int64_t>>(consume);
  }

  void Take(const std::string& request, const Dev* d, std::map<std::string, int64_t> consume) {
    for (const auto& c : d->spec->value("consumesCounters", json::array())) {
      auto& left = counters_[Cat(d->driver, "/", d->pool)][c.value("counterSet", "")];
      for (const auto& [name, v] : k8s::Field(c, "counters").items())
        left[name] -= Milli(v.value("value", json())).value_or(0);
    }
    picks_.push_back({request, d, std::move(consume)});
  }
  void Undo() {
    const Dev* d = picks_.back().dev;
    for (const auto& c : d->spec->value("consumesCounters", json::array())) {
      auto& left = counters_[Cat(d->driver, "/", d->pool)][c.value("counterSet", "")];
      for (const auto& [name, v] : k8s::Field(c, "counters").items())
        left[name] += Milli(v.value("value", json())).value_or(0);
    }
    picks_.pop_back();
  }

  std::vector<Dev> devices_;
  std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> counters_;  // pool -> set -> counter
  std::set<std::string> used_;
  std::map<std::string, std::map<std::string, int64_t>> consumed_;  // device -> capacity -> milli
  const DraWorld& world_;
  const json& claim_;
  const std::vector<std::vector<Alternative>>* requests_ = nullptr;
  std::vector<Pick> picks_;
};

}  // namespace

absl::StatusOr<json> AllocateClaim(const json& claim, const std::string& node, const DraWorld& world) {
  // Pools: the slices of the highest generation, per (driver, pool).
  std::map<std::pair<std::string, std::string>, std::vector<const json*>> pools;
  std::map<std::pair<std::string, std::string>, int64_t> generation;
  for (const auto& s : world.slices) {
    const json& spec = k8s::Field(s, "spec");
    const auto key = std::make_pair(spec.value("driver", ""), k8s::Field(spec, "pool").value("name", ""));
    const int64_t g = k8s::Field(spec, "pool").value("generation", int64_t{0});
    if (!generation.contains(key) || g > generation[key]) {
      generation[key] = g;
      pools[key].clear();
    }
    if (g == generation[key]) pools[key].push_back(&s);
  }
  std::vector<Dev> devices;
  std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> counters;
  std::map<std::string, const json*> by_key;  // all devices of every pool, for the allocated ones
  for (const auto& [key, slices] : pools) {
    const int64_t want = k8s::Field(k8s::Field(*slices[0], "spec"), "pool").value("resourceSliceCount", int64_t{1});
    const bool local = std::any_of(slices.begin(), slices.end(), [&](const json* s) {
      const json& spec = k8s::Field(*s, "spec");
      return spec.value("nodeName", "") == node || spec.value("allNodes", false);
    });
    for (const json* s : slices) {
      for (const auto& c : k8s::Field(*s, "spec").value("sharedCounters", json::array())) {
        for (const auto& [name, v] : k8s::Field(c, "counters").items()) {
          counters[Cat(key.first, "/", key.second)][c.value("name", "")][name] =
              Milli(v.value("value", json())).value_or(0);
        }
      }
      const json& spec = k8s::Field(*s, "spec");
      if (!spec.contains("devices") || !spec["devices"].is_array()) continue;
      for (const auto& d : spec["devices"]) {  // by reference: Dev points into the slice
        Dev dev{key.first, key.second, d.value("name", ""), &d};
        by_key[dev.key()] = &d;
        if (local && static_cast<int64_t>(slices.size()) == want) devices.push_back(dev);
      }
    }
  }
  // What other claims hold: whole devices, consumed capacity, counters.
  std::set<std::string> used;
  std::map<std::string, std::map<std::string, int64_t>> consumed;
  for (const auto& other : world.allocated) {
    if (k8s::Field(other, "metadata").value("uid", "") == k8s::Field(claim, "metadata").value("uid", "")) continue;
    for (const auto& r :
         k8s::Field(k8s::Field(k8s::Field(other, "status"), "allocation"), "devices").value("results", json::array())) {
      const std::string key = Cat(r.value("driver", ""), "/", r.value("pool", ""), "/", r.value("device", ""));
      for (const auto& [c, q] : k8s::Field(r, "consumedCapacity").items()) consumed[key][c] += Milli(q).value_or(0);
      if (!r.contains("consumedCapacity")) used.insert(key);
      const auto d = by_key.find(key);
      if (d == by_key.end()) continue;
      for (const auto& c : d->second->value("consumesCounters", json::array())) {
        auto& left = counters[Cat(r.value("driver", ""), "/", r.value("pool", ""))][c.value("counterSet", "")];
        for (const auto& [name, v] : k8s::Field(c, "counters").items())
          left[name] -= Milli(v.value("value", json())).value_or(0);
      }
    }
  }
  std::vector<std::vector<Alternative>> requests;  // Alternative points into the claim
  const json& claim_devices = k8s::Field(k8s::Field(claim, "spec"), "devices");
  static const json kNone = json::array();
  for (const auto& r : claim_devices.contains("requests") ? claim_devices["requests"] : kNone) {
    std::vector<Alternative> alts;
    const std::string name = r.value("name", "");
    if (r.contains("exactly")) {
      alts.push_back({name, &r["exactly"]});
    } else {
      for (const auto& sub : r.contains("firstAvailable") ? r["firstAvailable"] : kNone) {
        alts.push_back({Cat(name, "/", sub.value("name", "")), &sub});
      }
    }
    requests.push_back(std::move(alts));
  }
  Search search(devices, counters, used, consumed, world, claim);
  auto found = search.Run(requests);
  if (!found.ok()) return found.status();
  const std::string claim_name = k8s::Field(claim, "metadata").value("name", "");
  if (!*found) {
    return absl::FailedPreconditionError(Cat("cannot allocate all claims: node ", node, ": claim ", claim_name,
                                             search.why.empty() ? std::string() : Cat(" (", search.why, ")")));
  }
  json results = json::array();
  std::map<std::string, std::vector<std::string>> class_requests;  // class -> requests using it
  for (const auto& p : search.picks()) {
    json r = {{"request", p.request}, {"driver", p.dev->driver}, {"pool", p.dev->pool}, {"device", p.dev->name}};
    if (p.dev->spec->value("allowMultipleAllocations", false)) {
      r["shareID"] = Uuid();
      json cc = json::object();
      for (const auto& [c, v] : p.consumed) cc[c] = Canonical(v);
      r["consumedCapacity"] = cc;
    }
    results.push_back(std::move(r));
  }
  for (const auto& rq : requests) {
    for (const auto& alt : rq) {
      for (const auto& p : search.picks()) {
        if (p.request == alt.name) class_requests[alt.spec->value("deviceClassName", "")].push_back(alt.name);
      }
    }
  }
  json config = json::array();
  for (const auto& [cls, reqs] : class_requests) {
    for (const auto& c : k8s::Field(world.classes.at(cls), "spec").value("config", json::array())) {
      config.push_back({{"source", "FromClass"}, {"requests", reqs}, {"opaque", k8s::Field(c, "opaque")}});
    }
  }
  for (const auto& c : k8s::Field(k8s::Field(claim, "spec"), "devices").value("config", json::array())) {
    config.push_back({{"source", "FromClaim"},
                      {"requests", c.value("requests", json::array())},
                      {"opaque", k8s::Field(c, "opaque")}});
  }
  const json field = {{"key", "metadata.name"}, {"operator", "In"}, {"values", json::array({node})}};
  const json term = {{"matchFields", json::array({field})}};
  json allocation = {{"devices", {{"results", results}}}};
  allocation["nodeSelector"]["nodeSelectorTerms"] = json::array({term});
  if (!config.empty()) allocation["devices"]["config"] = config;
  return allocation;
}

}  // namespace kgpu::testing
