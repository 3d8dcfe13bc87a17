#include "k8s/informer.h"

#include <random>

#include "common/backoff.h"
#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"

namespace kgpu::k8s {

std::string ObjectKey(const nlohmann::json& obj) {
  if (!obj.is_object() || !obj.contains("metadata")) return "";
  const auto& m = obj["metadata"];
  const std::string ns = m.value("namespace", "");
  const std::string name = m.value("name", "");
  return ns.empty() ? name : Cat(ns, "/", name);
}

void Store::AddIndexer(const std::string& name, IndexFunc f) {
  std::unique_lock lock(mu_);
  index_funcs_[name] = std::move(f);
  for (const auto& [key, obj] : items_) {
    for (const auto& v : index_funcs_[name](obj)) indices_[name][v].insert(key);
  }
}

void Store::IndexLocked(const std::string& key, const nlohmann::json& obj, bool add) {
  for (const auto& [name, f] : index_funcs_) {
    for (const auto& v : f(obj)) {
      auto& set = indices_[name][v];
      if (add) {
        set.insert(key);
      } else {
        set.erase(key);
        if (set.empty()) indices_[name].erase(v);
      }
    }
  }
}

std::optional<nlohmann::json> Store::Get(const std::string& key) const {
  std::shared_lock lock(mu_);
  auto it = items_.find(key);
  if (it == items_.end()) return std::nullopt;
  return it->second;
}

std::vector<nlohmann::json> Store::List() const {
  std::shared_lock lock(mu_);
  std::vector<nlohmann::json> out;
  out.reserve(items_.size());
  for (const auto& [_, v] : items_) out.push_back(v);
  return out;
}

std::vector<std::string> Store::Keys() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [k, _] : items_) out.push_back(k);
  return out;
}

std::vector<nlohmann::json> Store::ByIndex(const std::string& index, const std::string& value) const {
  std::shared_lock lock(mu_);
  std::vector<nlohmann::json> out;
  auto idx = indices_.find(index);
  if (idx == indices_.end()) return out;
  auto keys = idx->second.find(value);
  if (keys == idx->second.end()) return out;
  for (const auto& k : keys->second) out.push_back(items_.at(k));
  return out;
}

size_t Store::Size() const {
  std::shared_lock lock(mu_);
  return items_.size();
}

std::optional<nlohmann::json> Store::Upsert(const std::string& key, nlohmann::json obj) {
  std::unique_lock lock(mu_);
  std::optional<nlohmann::json> old;
  auto it = items_.find(key);
  if (it != items_.end()) {
    IndexLocked(key, it->second, false);
    old = std::move(it->second);
    it->second = std::move(obj);
    IndexLocked(key, it->second, true);
  } else {
    IndexLocked(key, obj, true);
    items_.emplace(key, std::move(obj));
  }
  return old;
}

std::optional<nlohmann::json> Store::Remove(const std::string& key) {
  std::unique_lock lock(mu_);
  auto it = items_.find(key);
  if (it == items_.end()) return std::nullopt;
  IndexLocked(key, it->second, false);
  nlohmann::json old = std::move(it->second);
  items_.erase(it);
  return old;
}

Informer::Informer(Client& client, InformerOptions opts) : client_(client), opts_(std::move(opts)) {}

Informer::~Informer() {
  Stop();
}

void Informer::AddHandler(Handlers h) {
  handlers_.push_back(std::move(h));
}

void Informer::Start() {
  thread_ = std::jthread([this](std::stop_token st) { Run(st); });
  if (opts_.resync.count() > 0) {
    resync_thread_ = std::jthread([this](std::stop_token st) {
      while (SleepFor(st, opts_.resync)) {
        if (!synced_) continue;
        // client-go's resync: every object in the store is delivered again as an update.
        for (const auto& obj : store_.List()) {
          Dispatch([&](const Handlers& h) {
            if (h.on_update) h.on_update(obj, obj);
          });
        }
      }
    });
  }
}

void Informer::RequestStop() {
  resync_thread_.request_stop();
  thread_.request_stop();
}

void Informer::Stop() {
  RequestStop();
  if (resync_thread_.joinable()) resync_thread_.join();
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return synced_.load(); });
}

std::string Informer::LastResourceVersion() const {
  std::lock_guard lock(mu_);
  return rv_;
}

Informer::Stats Informer::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Informer::Dispatch(const std::function<void(const Handlers&)>& f) {
  std::lock_guard lock(dispatch_mu_);
  for (const auto& h : handlers_) f(h);
}

absl::Status Informer::ListAndReplace(const std::string& resource_version) {
  ListOptions lo;
  lo.resource_version = resource_version;
  lo.label_selector = opts_.label_selector;
  lo.field_selector = opts_.field_selector;
  lo.limit = opts_.page_size;
  auto list = client_.List(opts_.path, lo);
  if (!list.ok()) return list.status();
  std::set<std::string> seen;
  for (auto& item : (*list)["items"]) {
    const std::string key = ObjectKey(item);
    seen.insert(key);
    const nlohmann::json copy = item;
    auto old = store_.Upsert(key, std::move(item));
    if (!old) {
      Dispatch([&](const Handlers& h) {
        if (h.on_add) h.on_add(copy);
      });
    } else if ((*old)["metadata"].value("resourceVersion", "") != copy["metadata"].value("resourceVersion", "")) {
      Dispatch([&](const Handlers& h) {
        if (h.on_update) h.on_update(*old, copy);
      });
    }
  }
  for (const auto& key : store_.Keys()) {
    if (seen.contains(key)) continue;
    if (auto old = store_.Remove(key)) {
      Dispatch([&](const Handlers& h) {
        if (h.on_delete) h.on_delete(*old);
      });
    }
  }
  {
    std::lock_guard lock(mu_);
    rv_ = (*list)["metadata"].value("resourceVersion", "");
    ++stats_.lists;
    synced_ = true;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void Informer::Apply(const WatchEvent& ev) {
  const std::string rv = ev.object["metadata"].value("resourceVersion", "");
  {
    std::lock_guard lock(mu_);
    if (!rv.empty()) rv_ = rv;
    if (ev.type != "BOOKMARK") ++stats_.events;
  }
  if (ev.type == "BOOKMARK") return;
  const std::string key = ObjectKey(ev.object);
  if (ev.type == "ADDED" || ev.type == "MODIFIED") {
    auto old = store_.Upsert(key, ev.object);
    if (old) {
      Dispatch([&](const Handlers& h) {
        if (h.on_update) h.on_update(*old, ev.object);
      });
    } else {
      Dispatch([&](const Handlers& h) {
        if (h.on_add) h.on_add(ev.object);
      });
    }
  } else if (ev.type == "DELETED") {
    auto old = store_.Remove(key);
    Dispatch([&](const Handlers& h) {
      if (h.on_delete) h.on_delete(old ? *old : ev.object);
    });
  }
}

void Informer::Run(std::stop_token stop) {
  auto log = Log("k8s");
  kgpu::Backoff delay(opts_.initial_backoff, opts_.max_backoff, 1.0);  // each wait 1-2x the delay
  bool need_list = true;
  std::string list_rv = opts_.consistent_list ? "" : "0";
  std::mt19937 rng{std::random_device{}()};
  while (!stop.stop_requested()) {
    if (need_list) {
      if (auto s = ListAndReplace(list_rv); !s.ok()) {
        log->warn("informer {}: list failed: {}", opts_.path, std::string(s.message()));
        {
          std::lock_guard lock(mu_);
          ++stats_.errors;
        }
        SleepFor(stop, delay.Next());
        continue;
      }
      need_list = false;
      delay.Reset();
    }
    WatchOptions wo;
    wo.resource_version = LastResourceVersion();
    wo.label_selector = opts_.label_selector;
    wo.field_selector = opts_.field_selector;
    std::uniform_int_distribution<int> t(opts_.watch_timeout_seconds, 2 * opts_.watch_timeout_seconds);
    wo.timeout_seconds = t(rng);
    {
      std::lock_guard lock(mu_);
      ++stats_.watches;
    }
    const auto started = std::chrono::steady_clock::now();
    bool gone = false;
    bool got_events = false;
    absl::Status event_error;
    auto s = client_.Watch(
        opts_.path, wo,
        [&](const WatchEvent& ev) {
          if (ev.type == "ERROR") {
            const int code = ev.object.value("code", 0);
            if (code == 410) {
              gone = true;
            } else {
              event_error =
                  absl::UnavailableError(Cat("watch ", opts_.path, ": ", ev.object.value("message", "error event")));
            }
            return false;
          }
          got_events = true;
          Apply(ev);
          return !stop.stop_requested();
        },
        stop);
    if (stop.stop_requested()) break;
    if (gone || IsApiGone(s)) {
      log->info("informer {}: resourceVersion {} is too old (410 Gone); relisting", opts_.path, wo.resource_version);
      std::lock_guard lock(mu_);
      ++stats_.gone;
      need_list = true;
      list_rv = "";
      continue;
    }
    if (!s.ok() || !event_error.ok()) {
      log->warn("informer {}: watch ended: {}; resuming from {}", opts_.path,
                std::string((!s.ok() ? s : event_error).message()), LastResourceVersion());
      {
        std::lock_guard lock(mu_);
        ++stats_.errors;
      }
      SleepFor(stop, delay.Next());
      continue;
    }
    if (got_events) {
      delay.Reset();
    } else if (std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) {
      SleepFor(stop, delay.Next());  // a server closing watches at once must not make us spin
    }
  }
}

}  // namespace kgpu::k8s
