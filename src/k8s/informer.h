#pragma once
// An informer for one resource collection, as client-go's SharedIndexInformer: a reflector
// lists (paginated) and then watches from the list's resourceVersion with bookmarks; a dropped
// watch resumes from the last resourceVersion seen; 410 Gone (the version was compacted)
// relists and reconciles the store, firing add/update/delete for the difference; errors back
// off exponentially with jitter. The store is indexed by "<namespace>/<name>" (or "<name>")
// plus any indexers added before Start(). Handlers run on the informer's thread, in order;
// a resync period re-delivers every object as an update. HasSynced() turns true after the
// first complete list.
//
// Thread-safety: Store reads and HasSynced from any thread; AddHandler/AddIndexer before Start.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "k8s/client.h"

namespace kgpu::k8s {

// "<namespace>/<name>" or "<name>" for cluster-scoped objects.
std::string ObjectKey(const nlohmann::json& obj);

class Store {
 public:
  using IndexFunc = std::function<std::vector<std::string>(const nlohmann::json&)>;
  void AddIndexer(const std::string& name, IndexFunc f);
  std::optional<nlohmann::json> Get(const std::string& key) const;
  std::vector<nlohmann::json> List() const;
  std::vector<std::string> Keys() const;
  std::vector<nlohmann::json> ByIndex(const std::string& index, const std::string& value) const;
  size_t Size() const;

  // Writers (the reflector): return the previous object if any.
  std::optional<nlohmann::json> Upsert(const std::string& key, nlohmann::json obj);
  std::optional<nlohmann::json> Remove(const std::string& key);

 private:
  void IndexLocked(const std::string& key, const nlohmann::json& obj, bool add);
  mutable std::shared_mutex mu_;
  std::map<std::string, nlohmann::json> items_;
  std::map<std::string, IndexFunc> index_funcs_;
  std::map<std::string, std::map<std::string, std::set<std::string>>> indices_;
};

struct InformerOptions {
  std::string path;  // collection path, e.g. "/api/v1/pods" or "/api/v1/namespaces/x/pods"
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;
  std::chrono::milliseconds resync{0};  // 0 = never
  int watch_timeout_seconds = 300;      // the server ends each watch after 1-2x this (jitter)
  // The first list as client-go's reflector makes it: resourceVersion=0, served from the API
  // server's watch cache (not a quorum read of etcd). True asks for a consistent list instead. A
  // relist after 410 Gone is always consistent (the reflector's relistResourceVersion "").
  bool consistent_list = false;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{30000};
};

struct Handlers {
  std::function<void(const nlohmann::json&)> on_add;
  std::function<void(const nlohmann::json& old_obj, const nlohmann::json& new_obj)> on_update;
  std::function<void(const nlohmann::json&)> on_delete;
};

class Informer {
 public:
  Informer(Client& client, InformerOptions opts);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void AddHandler(Handlers h);
  void AddIndexer(const std::string& name, Store::IndexFunc f) { store_.AddIndexer(name, std::move(f)); }
  void Start();
  // Asks the threads to stop without waiting: a watch notices within about a second (libcurl's
  // progress callback), so an owner of several informers asks them all before it Stop()s each.
  void RequestStop();
  void Stop();
  bool HasSynced() const { return synced_; }
  // Waits until synced or the timeout; true when synced.
  bool WaitForSync(std::chrono::milliseconds timeout);
  const Store& store() const { return store_; }
  std::string LastResourceVersion() const;

  struct Stats {
    uint64_t lists = 0;    // complete lists (the first one and every relist)
    uint64_t watches = 0;  // watch requests started
    uint64_t events = 0;   // watch events applied (bookmarks excluded)
    uint64_t gone = 0;     // 410 Gone answers
    uint64_t errors = 0;   // other failures (each followed by a backoff)
  };
  Stats stats() const;

 private:
  void Run(std::stop_token stop);
  absl::Status ListAndReplace(const std::string& resource_version);
  void Apply(const WatchEvent& ev);
  void Dispatch(const std::function<void(const Handlers&)>& f);

  Client& client_;
  InformerOptions opts_;
  Store store_;
  std::vector<Handlers> handlers_;
  std::mutex dispatch_mu_;  // handlers run one at a time (watch thread and resync thread)
  std::atomic<bool> synced_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string rv_;
  Stats stats_;
  std::jthread thread_;
  std::jthread resync_thread_;
};

}  // namespace kgpu::k8s
