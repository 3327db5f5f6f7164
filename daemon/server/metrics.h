// The Prometheus endpoint (`--metrics-listen`): /metrics in the text exposition format, and
// /healthz (the health service's answers, for probes), served by prometheus-cpp's exposer. Every
// scrape reads the daemon's stats at that moment; nothing is kept between scrapes. Read-only: it
// offers no control.
#ifndef STASH_DAEMON_METRICS_H_
#define STASH_DAEMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "stash/status.h"

namespace prometheus {
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace stash::daemon {

class DaemonCore;

// At most this many (rank, device, label) series per session metric; sessions beyond it are
// summed into one series labelled rank="other", device="other", label="other".
inline constexpr size_t kMaxSessionSeries = 256;

// The metric families of one scrape of `core` (also what tests check without HTTP).
std::vector<prometheus::MetricFamily> CollectMetrics(DaemonCore& core);

// /healthz: the gRPC health service's two answers as a gauge, so a liveness probe (an HTTP GET,
// Kubernetes httpGet) need not share the trainers' socket or its connection budget.
std::vector<prometheus::MetricFamily> CollectHealth(DaemonCore& core);

// A running /metrics endpoint. Stops serving when destroyed; `core` must outlive it.
class MetricsServer {
 public:
  // Binds `address` (HOST:PORT; port 0 picks a free one). UNAVAILABLE when it cannot listen.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                        DaemonCore* core);
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer();

  // The port it listens on.
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  struct Collector;
  struct HealthCollector;
  std::shared_ptr<Collector> collector_;
  std::shared_ptr<HealthCollector> health_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_METRICS_H_
