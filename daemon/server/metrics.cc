#include "daemon/server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "common/logging.h"
#include "common/version.h"
#include "daemon/core/core.h"
#include "daemon/stats/histogram.h"
#include "daemon/stats/process_stats.h"
#include "daemon/stats/stats.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

using Labels = std::vector<ClientMetric::Label>;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void Add(MetricFamily& family, Labels labels, double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

// `units_per_exposed` converts the histogram's unit to the exposed one (microseconds per second:
// 1e6). A division, not a multiplication by 1e-6: 10 / 1e6 is the double nearest 1e-05 and
// prints as le="1e-05", where 10 * 1e-6 prints as le="9.999999999999999e-06".
void AddHistogram(MetricFamily& family, Labels labels, const CumulativeHistogram& histogram,
                  double units_per_exposed) {
  const CumulativeHistogram::Snapshot snap = histogram.Read();
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram.sample_count = snap.count;
  metric.histogram.sample_sum = snap.sum / units_per_exposed;
  for (size_t i = 0; i < snap.counts.size(); ++i) {
    ClientMetric::Bucket bucket;
    bucket.cumulative_count = snap.counts[i];
    bucket.upper_bound = i < snap.bounds.size() ? snap.bounds[i] / units_per_exposed
                                                : std::numeric_limits<double>::infinity();
    metric.histogram.bucket.push_back(bucket);
  }
  family.metric.push_back(std::move(metric));
}

// A label a client chose: at most 64 bytes, control characters as '?', so a session cannot
// blow up the exposition or the series' size.
std::string SafeLabel(const std::string& text) {
  std::string out = text.substr(0, 64);
  for (char& ch : out) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f) ch = '?';
  }
  return out;
}

// Per-session numbers summed per (rank, device, label): two sessions with the same identity are
// one series, and past kMaxSessionSeries identities the rest go to "other".
struct SessionSums {
  double pages_held = 0, bytes_held = 0, stashes_held = 0;
  double stashes = 0, reloads = 0, releases = 0, spills = 0, overflows = 0, rejected = 0;
  double bytes_stashed = 0, bytes_reloaded = 0, sessions = 0;
};

void SessionFamilies(const v1::GetStatsResponse& stats, std::vector<MetricFamily>* out) {
  using Key = std::tuple<std::string, std::string, std::string>;
  std::map<Key, SessionSums> sums;
  SessionSums other;
  bool has_other = false;
  for (const v1::SessionStats& s : stats.sessions()) {
    Key key{s.rank() < 0 ? "" : std::to_string(s.rank()), std::to_string(s.pool()),
            SafeLabel(s.label())};
    SessionSums* sum = nullptr;
    if (auto it = sums.find(key); it != sums.end()) {
      sum = &it->second;
    } else if (sums.size() < kMaxSessionSeries) {
      sum = &sums[key];
    } else {
      sum = &other;
      has_other = true;
    }
    sum->sessions += 1;
    sum->pages_held += static_cast<double>(s.pages_live());
    sum->bytes_held += static_cast<double>(s.bytes_live());
    sum->stashes_held += static_cast<double>(s.stashes_live());
    sum->stashes += static_cast<double>(s.stashes());
    sum->reloads += static_cast<double>(s.reloads());
    sum->releases += static_cast<double>(s.releases());
    sum->spills += static_cast<double>(s.spills());
    sum->overflows += static_cast<double>(s.overflows());
    sum->rejected += static_cast<double>(s.rejected());
    sum->bytes_stashed += static_cast<double>(s.bytes_stashed());
    sum->bytes_reloaded += static_cast<double>(s.bytes_reloaded());
  }
  if (has_other) sums[Key{"other", "other", "other"}] = other;

  struct Spec {
    const char* name;
    const char* help;
    MetricType type;
    double SessionSums::*field;
  };
  const Spec specs[] = {
      {"stashd_session_connected", "Sessions connected with this rank, device and label",
       MetricType::Gauge, &SessionSums::sessions},
      {"stashd_session_pages_held", "Pages the session's stashes hold now", MetricType::Gauge,
       &SessionSums::pages_held},
      {"stashd_session_held_bytes", "Payload bytes the session's stashes hold now",
       MetricType::Gauge, &SessionSums::bytes_held},
      {"stashd_session_stashes_held", "Stashes the session holds now", MetricType::Gauge,
       &SessionSums::stashes_held},
      {"stashd_session_stashes_total", "Stashes the session made that took data (not overflowed)",
       MetricType::Counter, &SessionSums::stashes},
      {"stashd_session_reloads_total", "Stashes the session reloaded", MetricType::Counter,
       &SessionSums::reloads},
      {"stashd_session_releases_total", "Stashes the session released without reloading",
       MetricType::Counter, &SessionSums::releases},
      {"stashd_session_spills_total",
       "Stashes of the session that went outside its own pool (the host tier or the peer tier)",
       MetricType::Counter, &SessionSums::spills},
      {"stashd_session_overflows_total",
       "Stashes of the session answered OVERFLOW (no tier had room; the rank kept its buffer)",
       MetricType::Counter, &SessionSums::overflows},
      {"stashd_session_rejects_total", "Requests of the session answered with an error",
       MetricType::Counter, &SessionSums::rejected},
      {"stashd_session_stashed_bytes_total", "Payload bytes the session stashed",
       MetricType::Counter, &SessionSums::bytes_stashed},
      {"stashd_session_reloaded_bytes_total", "Payload bytes the session reloaded",
       MetricType::Counter, &SessionSums::bytes_reloaded},
  };
  for (const Spec& spec : specs) {
    MetricFamily family = Family(spec.name, spec.help, spec.type);
    for (const auto& [key, sum] : sums) {
      Add(family,
          {{"device", std::get<1>(key)}, {"label", std::get<2>(key)}, {"rank", std::get<0>(key)}},
          sum.*spec.field);
    }
    out->push_back(std::move(family));
  }
}

// Per group of mapped sessions (GetStats' group rows, at most 256: the daemon's cap keeps these
// families as small as the per-session ones), labelled by its name and uid. Two rows with one
// name and uid (a group that ended while its members' processes live, and its successor) are
// one series: counts summed, the high water the larger. Like the session series, a group's
// series exist while the daemon reports it, and go with it.
struct GroupSums {
  double members = 0, pages_held = 0, pages_claimed = 0, pages_claimed_high_water = 0;
  double depot_misses = 0, depot_missed_pages = 0, chunks_leaving = 0;
};

// A member's claimed pages by kind, per (group, uid, rank); past kMaxSessionSeries keys the
// rest go to group="other", uid="other", rank="other", as the session series do.
struct MemberSums {
  double device = 0, peer = 0, host = 0;
};

void GroupFamilies(const v1::GetStatsResponse& stats, std::vector<MetricFamily>* out) {
  using GroupKey = std::pair<std::string, std::string>;  // name, uid
  std::map<GroupKey, GroupSums> groups;
  using MemberKey = std::tuple<std::string, std::string, std::string>;  // name, uid, rank
  std::map<MemberKey, MemberSums> members;
  MemberSums other;
  bool has_other = false;
  for (const v1::GroupStats& g : stats.groups()) {
    const GroupKey key{SafeLabel(g.name()), std::to_string(g.uid())};
    GroupSums& sum = groups[key];
    sum.members += g.members();
    for (const v1::GroupTierStats& t : g.tiers()) sum.pages_held += static_cast<double>(t.pages());
    sum.pages_claimed += static_cast<double>(g.pages_claimed());
    sum.pages_claimed_high_water =
        std::max(sum.pages_claimed_high_water, static_cast<double>(g.pages_claimed_high_water()));
    sum.depot_misses += static_cast<double>(g.depot_misses());
    sum.depot_missed_pages += static_cast<double>(g.depot_missed_pages());
    sum.chunks_leaving += static_cast<double>(g.chunks_leaving());
    for (const v1::GroupMemberStats& m : g.member_rows()) {
      const MemberKey member{key.first, key.second, m.rank() < 0 ? "" : std::to_string(m.rank())};
      MemberSums* msum = nullptr;
      if (auto it = members.find(member); it != members.end()) {
        msum = &it->second;
      } else if (members.size() < kMaxSessionSeries) {
        msum = &members[member];
      } else {
        msum = &other;
        has_other = true;
      }
      msum->device += static_cast<double>(m.device_pages());
      msum->peer += static_cast<double>(m.peer_pages());
      msum->host += static_cast<double>(m.host_pages());
    }
  }
  if (has_other) members[MemberKey{"other", "other", "other"}] = other;

  struct Spec {
    const char* name;
    const char* help;
    MetricType type;
    double GroupSums::*field;
  };
  const Spec specs[] = {
      {"stashd_group_members",
       "Sessions in the group (live, or ended while their process lives and may map its memory)",
       MetricType::Gauge, &GroupSums::members},
      {"stashd_group_pages_held", "Pages of the chunks the group holds now, every tier",
       MetricType::Gauge, &GroupSums::pages_held},
      {"stashd_group_pages_claimed",
       "Pages of the group's chunks its members own now (cached free or under a stash)",
       MetricType::Gauge, &GroupSums::pages_claimed},
      {"stashd_group_pages_claimed_high_water",
       "The most pages the group's members owned at once since it formed", MetricType::Gauge,
       &GroupSums::pages_claimed_high_water},
      {"stashd_group_depot_misses_total",
       "Refills of a member's own device that came short (depot misses) since the group formed",
       MetricType::Counter, &GroupSums::depot_misses},
      {"stashd_group_depot_missed_pages_total", "Pages the group's depot misses lacked",
       MetricType::Counter, &GroupSums::depot_missed_pages},
      {"stashd_group_chunks_leaving",
       "Chunks the group is giving back, waiting for every member to unmap them", MetricType::Gauge,
       &GroupSums::chunks_leaving},
  };
  for (const Spec& spec : specs) {
    MetricFamily family = Family(spec.name, spec.help, spec.type);
    for (const auto& [key, sum] : groups) {
      Add(family, {{"group", key.first}, {"uid", key.second}}, sum.*spec.field);
    }
    out->push_back(std::move(family));
  }
  MetricFamily pages = Family("stashd_group_member_pages_claimed",
                              "Pages a member of the group owns now, by kind: its own device's "
                              "chunks (device), other devices' (peer), the host tier's (host)",
                              MetricType::Gauge);
  for (const auto& [key, sum] : members) {
    const auto& [group, uid, rank] = key;
    for (const auto& [kind, value] : {std::pair<const char*, double>{"device", sum.device},
                                      {"peer", sum.peer},
                                      {"host", sum.host}}) {
      Add(pages, {{"group", group}, {"kind", kind}, {"rank", rank}, {"uid", uid}}, value);
    }
  }
  out->push_back(std::move(pages));
}

// One series per knob, its effective value and source as labels (what `stashctl config` shows),
// so dashboards and alerts can join on what a node was started with.
void ConfigFamily(const DaemonCore& core, std::vector<MetricFamily>* out) {
  MetricFamily family = Family("stashd_config_info",
                               "The daemon's effective knobs: value and source (default, env, "
                               "flag) as labels; always 1",
                               MetricType::Gauge);
  const v1::GetConfigResponse config = core.Config();
  for (const v1::ConfigEntry& e : config.entries()) {
    Add(family, {{"knob", e.name()}, {"source", e.source()}, {"value", SafeLabel(e.value())}}, 1);
  }
  out->push_back(std::move(family));
}

// The process_* series Prometheus's client libraries export for their process. Left out of a
// scrape when /proc cannot be read (never on Linux).
void ProcessFamilies(std::vector<MetricFamily>* out) {
  const StatusOr<ProcessStats> stats = ReadProcessStats();
  if (!stats.ok()) return;
  struct Spec {
    const char* name;
    const char* help;
    MetricType type;
    double value;
  };
  const Spec specs[] = {
      {"process_cpu_seconds_total", "Total user and system CPU time spent in seconds",
       MetricType::Counter, stats->cpu_seconds},
      {"process_resident_memory_bytes", "Resident memory size in bytes", MetricType::Gauge,
       static_cast<double>(stats->resident_bytes)},
      {"process_virtual_memory_bytes", "Virtual memory size in bytes", MetricType::Gauge,
       static_cast<double>(stats->virtual_bytes)},
      {"process_open_fds", "Number of open file descriptors", MetricType::Gauge,
       static_cast<double>(stats->open_fds)},
      {"process_max_fds", "Maximum number of open file descriptors", MetricType::Gauge,
       static_cast<double>(stats->max_fds)},
      {"process_start_time_seconds", "Start time of the process since unix epoch in seconds",
       MetricType::Gauge, stats->start_time_s},
  };
  for (const Spec& spec : specs) {
    MetricFamily family = Family(spec.name, spec.help, spec.type);
    Add(family, {}, spec.value);
    out->push_back(std::move(family));
  }
}

}  // namespace

std::vector<MetricFamily> CollectMetrics(DaemonCore& core) {
  const v1::GetStatsResponse stats = core.Stats();
  const v1::DaemonStats& d = stats.daemon();
  std::vector<MetricFamily> out;

  MetricFamily build =
      Family("stashd_build_info", "The daemon's version and backend (always 1)", MetricType::Gauge);
  Add(build,
      {{"backend", core.backend() == v1::BACKEND_CUDA ? "cuda" : "host"}, {"version", kVersion}},
      1);
  out.push_back(std::move(build));
  MetricFamily uptime =
      Family("stashd_uptime_seconds", "Seconds since the daemon started", MetricType::Gauge);
  Add(uptime, {}, d.uptime_s());
  out.push_back(std::move(uptime));
  MetricFamily draining =
      Family("stashd_draining",
             "1 while the daemon drains (stashctl drain, SIGTERM): new sessions and "
             "stashes are refused",
             MetricType::Gauge);
  Add(draining, {}, core.draining() ? 1 : 0);
  out.push_back(std::move(draining));
  ConfigFamily(core, &out);
  ProcessFamilies(&out);

  struct Node {
    const char* name;
    const char* help;
    MetricType type;
    uint64_t value;
  };
  const Node node[] = {
      {"stashd_sessions", "Sessions connected now", MetricType::Gauge, d.sessions_live()},
      {"stashd_sessions_started_total", "Sessions started", MetricType::Counter,
       d.sessions_total()},
      {"stashd_stashes_total", "Stashes that took data", MetricType::Counter, d.stashes()},
      {"stashd_reloads_total", "Stashes reloaded", MetricType::Counter, d.reloads()},
      {"stashd_releases_total", "Stashes released without reloading", MetricType::Counter,
       d.releases()},
      {"stashd_spills_total",
       "Stashes that went outside their own pool (the host tier or the peer tier)",
       MetricType::Counter, d.spills()},
      {"stashd_overflows_total", "Stashes answered OVERFLOW", MetricType::Counter, d.overflows()},
      {"stashd_rejects_total", "Requests answered with an error", MetricType::Counter,
       d.rejected()},
      {"stashd_stashed_bytes_total", "Payload bytes stashed", MetricType::Counter,
       d.bytes_stashed()},
      {"stashd_reloaded_bytes_total", "Payload bytes reloaded", MetricType::Counter,
       d.bytes_reloaded()},
  };
  for (const Node& n : node) {
    MetricFamily family = Family(n.name, n.help, n.type);
    Add(family, {}, static_cast<double>(n.value));
    out.push_back(std::move(family));
  }

  // Per tier: device pools ("gpu0".., device = pool index) and host tiers.
  struct TierSpec {
    const char* name;
    const char* help;
    double (*value)(const v1::TierStats&);
  };
  const TierSpec tier_specs[] = {
      {"stashd_tier_pages", "Pages of the tier",
       [](const v1::TierStats& t) { return static_cast<double>(t.pages_total()); }},
      {"stashd_tier_pages_used", "Pages of the tier in use now",
       [](const v1::TierStats& t) { return static_cast<double>(t.pages_used()); }},
      {"stashd_tier_pages_high_water", "The most pages of the tier in use at once since start",
       [](const v1::TierStats& t) { return static_cast<double>(t.pages_high_water()); }},
      {"stashd_tier_bytes", "Bytes of the tier (pages times page size)",
       [](const v1::TierStats& t) {
         return static_cast<double>(t.pages_total() * t.page_bytes());
       }},
      {"stashd_tier_used_bytes", "Bytes of the tier's pages in use now",
       [](const v1::TierStats& t) { return static_cast<double>(t.pages_used() * t.page_bytes()); }},
      {"stashd_tier_high_water_bytes", "Bytes of the most pages in use at once since start",
       [](const v1::TierStats& t) {
         return static_cast<double>(t.pages_high_water() * t.page_bytes());
       }},
      {"stashd_tier_payload_bytes", "Payload bytes stashed in the tier now (<= used bytes)",
       [](const v1::TierStats& t) { return static_cast<double>(t.bytes_stashed()); }},
      {"stashd_tier_stashes", "Stashes held in the tier now",
       [](const v1::TierStats& t) { return static_cast<double>(t.stashes_live()); }},
      {"stashd_tier_pages_lent",
       "Pages of the device pool holding other devices' daemon-copy stashes now (the peer tier; "
       "in stashd_tier_pages_used)",
       [](const v1::TierStats& t) { return static_cast<double>(t.pages_lent()); }},
      {"stashd_tier_chunks_leased", "Chunks of the tier leased to mapped sessions now",
       [](const v1::TierStats& t) { return static_cast<double>(t.chunks_leased()); }},
      {"stashd_tier_chunks_free", "Chunks of the tier a mapped session could lease now",
       [](const v1::TierStats& t) { return static_cast<double>(t.chunks_free()); }},
      {"stashd_tier_chunks_orphaned",
       "Chunks of the tier whose session ended while its process lives",
       [](const v1::TierStats& t) { return static_cast<double>(t.chunks_orphaned()); }},
      {"stashd_tier_chunks_kept",
       "Chunks of the tier a live mapped session returned, charged to it until its process exits",
       [](const v1::TierStats& t) { return static_cast<double>(t.chunks_kept()); }},
      {"stashd_tier_chunks_waiting",
       "Chunks of the tier out of every ring until they get memory (tried every second)",
       [](const v1::TierStats& t) { return static_cast<double>(t.chunks_waiting()); }},
      {"stashd_tier_bytes_warm",
       "Bytes of the tier whose pages are populated (--warm-memory; below stashd_tier_bytes while "
       "the daemon warms it after start, and by each chunk back from a mapped session)",
       [](const v1::TierStats& t) { return static_cast<double>(t.bytes_warm()); }},
  };
  for (const TierSpec& spec : tier_specs) {
    MetricFamily family = Family(spec.name, spec.help, MetricType::Gauge);
    for (const v1::TierStats& t : stats.tiers()) {
      Add(family,
          {{"device", t.pool() >= 0 ? std::to_string(t.pool()) : "all"}, {"tier", t.name()}},
          spec.value(t));
    }
    out.push_back(std::move(family));
  }
  MetricFamily info =
      Family("stashd_tier_info", "1 per tier, labelled with the pages it asked for (--huge-pages)",
             MetricType::Gauge);
  for (const v1::TierStats& t : stats.tiers()) {
    if (t.page_kind().empty()) continue;
    Add(info,
        {{"device", t.pool() >= 0 ? std::to_string(t.pool()) : "all"},
         {"tier", t.name()},
         {"page_kind", t.page_kind()}},
        1);
  }
  if (!info.metric.empty()) out.push_back(std::move(info));

  SessionFamilies(stats, &out);
  GroupFamilies(stats, &out);

  const DaemonCounters& counters = core.counters();
  MetricFamily latency = Family("stashd_stash_latency_seconds",
                                "Stash latency, from receipt to copy done", MetricType::Histogram);
  AddHistogram(latency, {}, counters.stash_latency_us.histogram(), 1e6);
  out.push_back(std::move(latency));
  MetricFamily copy =
      Family("stashd_copy_throughput_bytes_per_second",
             "Rate of each stash (direction=stash) and reload copy", MetricType::Histogram);
  AddHistogram(copy, {{"direction", "stash"}}, counters.stash_copy.histogram(), 1);
  AddHistogram(copy, {{"direction", "reload"}}, counters.reload_copy.histogram(), 1);
  out.push_back(std::move(copy));
  return out;
}

struct MetricsServer::Collector final : prometheus::Collectable {
  explicit Collector(DaemonCore* c) : core(c) {}
  std::vector<MetricFamily> Collect() const override { return CollectMetrics(*core); }
  DaemonCore* const core;  // not owned
};

std::vector<MetricFamily> CollectHealth(DaemonCore& core) {
  MetricFamily serving =
      Family("stashd_health_serving",
             "The gRPC health service's answer: service=\"\" (readiness) is 0 while the daemon "
             "drains; service=\"stash.v1.StashService\" (liveness) is 1 while it lives",
             MetricType::Gauge);
  Add(serving, {{"service", ""}}, core.draining() ? 0 : 1);
  Add(serving, {{"service", "stash.v1.StashService"}}, 1);
  return {std::move(serving)};
}

struct MetricsServer::HealthCollector final : prometheus::Collectable {
  explicit HealthCollector(DaemonCore* c) : core(c) {}
  std::vector<MetricFamily> Collect() const override { return CollectHealth(*core); }
  DaemonCore* const core;  // not owned
};

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                              DaemonCore* core) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  // prometheus-cpp reports a port it cannot bind by throwing; nothing else here throws.
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve metrics on --metrics-listen=" + address + " (" +
                            e.what() + "): is the port free and the address local?");
  }
  server->collector_ = std::make_shared<Collector>(core);
  server->exposer_->RegisterCollectable(server->collector_);
  server->health_ = std::make_shared<HealthCollector>(core);
  server->exposer_->RegisterCollectable(server->health_, "/healthz");
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  return server;
}

MetricsServer::~MetricsServer() {
  // Stop serving before the collector (and the core it reads) can go away.
  exposer_.reset();
}

}  // namespace stash::daemon
