#include "client/stashctl/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>

#include "common/bytes.h"

namespace stash::stashctl {
namespace {

std::string Printf(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string Num(uint64_t value) { return std::to_string(value); }

// "-" for values a client left unset or unknown (rank -1, an empty label).
std::string RankText(int64_t rank) { return rank < 0 ? "-" : std::to_string(rank); }
std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

// "12 overflow,spilled", "12" (no flag), "- spilled" (no BeginStep yet), "-".
std::string StepFlags(const v1::SessionStats& s) {
  std::string flags;
  if (s.step_overflow()) flags = "overflow";
  if (s.step_spilled()) flags += flags.empty() ? "spilled" : ",spilled";
  const std::string step = s.step_begun() ? std::to_string(s.step()) : "-";
  return flags.empty() ? step : step + " " + flags;
}

// Control characters become '?'; everything else (UTF-8 included) passes.
std::string Sanitize(std::string text) {
  for (char& ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f) ch = '?';
  }
  return text;
}

std::string Pad(const std::string& text, size_t width, Table::Align align) {
  const size_t have = DisplayWidth(text);
  if (have >= width) return text;
  const std::string fill(width - have, ' ');
  return align == Table::Align::kLeft ? text + fill : fill + text;
}

// The session table; `with_identity` adds the session id prefix and age (`stashctl sessions`,
// where the table is all there is and the width is free).
std::string LeaseTierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE:
      return "device";
    case v1::TIER_PEER:
      return "peer";
    case v1::TIER_HOST:
      return "host";
    default:
      return "?";
  }
}

// A mapped session's lease in one cell: "device 4 chunks 10/64 pages hw 20, host ..."; "-" for
// a daemon-copy session.
std::string LeaseText(const v1::SessionStats& s) {
  if (s.mode() != v1::MODE_MAPPED) return "-";
  std::string out;
  for (const v1::LeaseStats& l : s.leases()) {
    out += (out.empty() ? "" : ", ") + LeaseTierName(l.tier()) + " " + Num(l.chunks()) +
           " chunks " + Num(l.pages_used()) + "/" + Num(l.pages_leased()) + " pages hw " +
           Num(l.pages_high_water());
  }
  return out.empty() ? "none" : out;
}

std::string SessionTable(const google::protobuf::RepeatedPtrField<v1::SessionStats>& sessions,
                         bool with_identity, size_t width) {
  using A = Table::Align;
  // On a narrow terminal: labels and leases are cut first, then columns go, least telling
  // first; rank, pid, label and what the session holds always show.
  std::vector<Table::Column> columns;
  if (with_identity) columns.push_back({"SESSION", A::kLeft, 0, 3});
  columns.insert(columns.end(), {{"RANK", A::kRight},
                                 {"PID", A::kRight},
                                 {"POOL", A::kRight, 0, 5},
                                 {"LABEL", A::kLeft, 12}});
  // Groups (Hello.group) get a column only when a session is in one: a node without them reads
  // as before.
  const bool with_group = std::any_of(sessions.begin(), sessions.end(),
                                      [](const v1::SessionStats& s) { return !s.group().empty(); });
  if (with_group) columns.push_back({"GROUP", A::kLeft, 12, 3});
  if (with_identity) columns.push_back({"AGE", A::kRight, 0, 7});
  columns.push_back({"MODE", A::kLeft, 0, 8});
  // Every header names its unit: counts of stashes or requests unless it says bytes or pages.
  columns.insert(columns.end(), {{"STASHES", A::kRight, 0, 6},
                                 {"RELOADS", A::kRight, 0, 9},
                                 {"STASHED BYTES", A::kRight, 0, 10},
                                 {"HELD BYTES", A::kRight},
                                 {"HELD PAGES", A::kRight, 0, 11},
                                 {"SPILLS", A::kRight, 0, 2},
                                 {"OVERFLOWS", A::kRight, 0, 1},
                                 {"REJECTED", A::kRight, 0, 4},
                                 {"LEASE", A::kLeft, 12, 12},
                                 {"STEP FLAGS", A::kLeft, 0, 1}});
  Table table(std::move(columns));
  for (const v1::SessionStats& s : sessions) {
    std::vector<std::string> row;
    // Eight hex characters tell sessions apart and match the daemon's log lines.
    if (with_identity) row.push_back(OrDash(s.session_id().substr(0, 8)));
    row.push_back(RankText(s.rank()));
    row.push_back(std::to_string(s.pid()));
    row.push_back(std::to_string(s.pool()));
    row.push_back(OrDash(s.label()));
    if (with_group) row.push_back(OrDash(s.group()));
    if (with_identity) row.push_back(FormatDuration(s.age_s()));
    row.emplace_back(s.mode() == v1::MODE_MAPPED ? "mapped" : "daemon-copy");
    row.push_back(Num(s.stashes()));
    row.push_back(Num(s.reloads()));
    row.push_back(FormatBytes(s.bytes_stashed()));
    row.push_back(FormatBytes(s.bytes_live()));
    row.push_back(Num(s.pages_live()));
    row.push_back(Num(s.spills()));
    row.push_back(Num(s.overflows()));
    row.push_back(Num(s.rejected()));
    row.push_back(LeaseText(s));
    row.push_back(StepFlags(s));
    table.AddRow(std::move(row));
  }
  return table.Render(width);
}

// The page size of the tier `name` names in the reply; 0 when it has no such tier.
uint64_t PageBytesOf(const google::protobuf::RepeatedPtrField<v1::TierStats>& tiers,
                     const std::string& name) {
  for (const v1::TierStats& t : tiers) {
    if (t.name() == name) return t.page_bytes();
  }
  return 0;
}

// What a group holds, in bytes; in pages when a tier's page size is not in the reply (an older
// daemon's, or a hand-made one).
std::string GroupHeld(const v1::GroupStats& g,
                      const google::protobuf::RepeatedPtrField<v1::TierStats>& tiers) {
  uint64_t bytes = 0, pages = 0;
  bool sized = true;
  for (const v1::GroupTierStats& t : g.tiers()) {
    const uint64_t page = PageBytesOf(tiers, t.tier());
    sized = sized && page != 0;
    bytes += t.pages() * page;
    pages += t.pages();
  }
  return sized ? FormatBytes(bytes) : Num(pages) + " pages";
}

std::string GroupTable(const v1::GetStatsResponse& stats, size_t width) {
  using A = Table::Align;
  // On a narrow terminal the name is cut first, then the least telling columns go; the name,
  // members, what the group holds and what its members claim always show.
  Table table({{"GROUP", A::kLeft, 12},
               {"UID", A::kRight, 0, 3},
               {"MEMBERS", A::kRight},
               {"CHUNK BYTES", A::kRight},
               {"CLAIMED/HIGH WATER PAGES", A::kRight},
               {"DEPOT MISSES", A::kRight, 0, 1},
               {"MISSED PAGES", A::kRight, 0, 4},
               {"LEAVING CHUNKS", A::kRight, 0, 2}});
  for (const v1::GroupStats& g : stats.groups()) {
    table.AddRow({OrDash(g.name()), std::to_string(g.uid()), std::to_string(g.members()),
                  GroupHeld(g, stats.tiers()),
                  Num(g.pages_claimed()) + "/" + Num(g.pages_claimed_high_water()),
                  Num(g.depot_misses()), Num(g.depot_missed_pages()), Num(g.chunks_leaving())});
  }
  return table.Render(width);
}

// Per group: its chunks by tier, then each member's claimed pages by kind.
std::string GroupDetails(const v1::GetStatsResponse& stats, size_t width) {
  using A = Table::Align;
  std::string out;
  for (const v1::GroupStats& g : stats.groups()) {
    out += "\ngroup " + OrDash(g.name()) + " (uid " + std::to_string(g.uid()) + ", id " +
           Num(g.group_id()) + "): chunks by tier\n";
    Table tiers({{"TIER", A::kLeft},
                 {"CHUNKS", A::kRight},
                 {"CLAIMED/TOTAL PAGES", A::kRight},
                 {"CHUNK BYTES", A::kRight}});
    for (const v1::GroupTierStats& t : g.tiers()) {
      const uint64_t page = PageBytesOf(stats.tiers(), t.tier());
      tiers.AddRow({OrDash(t.tier()), Num(t.chunks()),
                    Num(t.pages_claimed()) + "/" + Num(t.pages()),
                    page == 0 ? "-" : FormatBytes(t.pages() * page)});
    }
    out += tiers.rows() == 0 ? "holds no chunks\n" : tiers.Render(width);
    if (g.member_rows().empty()) {
      out += "no member rows\n";
      continue;
    }
    out += "members' claimed pages by kind\n";
    Table members({{"SESSION", A::kLeft},
                   {"RANK", A::kRight},
                   {"DEVICE PAGES", A::kRight},
                   {"PEER PAGES", A::kRight},
                   {"HOST PAGES", A::kRight}});
    std::vector<v1::GroupMemberStats> rows(g.member_rows().begin(), g.member_rows().end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::make_tuple(a.rank(), a.session_id()) < std::make_tuple(b.rank(), b.session_id());
    });
    for (const v1::GroupMemberStats& m : rows) {
      members.AddRow({OrDash(m.session_id().substr(0, 8)), RankText(m.rank()),
                      Num(m.device_pages()), Num(m.peer_pages()), Num(m.host_pages())});
    }
    out += members.Render(width);
  }
  return out;
}

}  // namespace

std::string UsageBar(uint64_t used, uint64_t total, int width) {
  width = std::max(width, 1);
  const auto cells = static_cast<uint64_t>(width);
  uint64_t filled = 0;
  std::string percent = "-%";
  if (total > 0) {
    used = std::min(used, total);
    // long double keeps used * cells exact for any page count a pool can have.
    filled = static_cast<uint64_t>(static_cast<long double>(used) * cells / total);
    const auto pct = static_cast<uint64_t>(static_cast<long double>(used) * 100 / total);
    if (used > 0 && filled == 0) filled = 1;
    percent = (used > 0 && pct == 0) ? "<1%" : std::to_string(pct) + "%";
  }
  std::string bar = "[";
  bar.append(filled, '#');
  bar.append(cells - filled, '.');
  bar += "] ";
  bar += Pad(percent, 4, Table::Align::kRight);
  return bar;
}

std::string FormatDuration(double seconds) {
  if (!(seconds > 0)) return "0s";  // also NaN
  const auto s = static_cast<uint64_t>(seconds);
  char buf[48];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llus", static_cast<unsigned long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%llum %02llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof(buf), "%lluh %02llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llud %02lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  }
  return buf;
}

std::string FormatLatencyUs(double us, bool valid) {
  if (!valid || !std::isfinite(us) || us < 0) return "-";
  if (us < 10) return Printf("%.1f us", us);
  if (us < 10e3) return Printf("%.0f us", us);
  if (us < 10e6) return Printf("%.1f ms", us / 1e3);
  return Printf("%.1f s", us / 1e6);
}

std::string FormatGbps(double gbps) {
  if (!std::isfinite(gbps) || gbps <= 0) return "-";
  // GB/s as the JSON's *_copy_gbps fields and the Grafana dashboard have it.
  if (gbps < 1) return Printf(gbps * 1e3 < 10 ? "%.2f MB/s" : "%.1f MB/s", gbps * 1e3);
  return Printf(gbps < 10 ? "%.2f GB/s" : "%.1f GB/s", gbps);
}

std::string BackendName(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_HOST:
      return "host";
    case v1::BACKEND_CUDA:
      return "cuda";
    default:
      return "unspecified";
  }
}

size_t DisplayWidth(std::string_view text) {
  size_t width = 0;
  for (char ch : text) {
    // Count every byte that is not a UTF-8 continuation byte (10xxxxxx).
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++width;
  }
  return width;
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  for (std::string& cell : cells) cell = Sanitize(std::move(cell));
  rows_.push_back(std::move(cells));
}

std::string Truncate(const std::string& text, size_t width) {
  if (DisplayWidth(text) <= width) return text;
  if (width == 0) return "";
  std::string out;
  size_t cells = 0;
  for (const char ch : text) {
    const bool starts_cell = (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    if (starts_cell && ++cells == width) break;
    out += ch;
  }
  return out + "~";
}

std::string FitLines(const std::string& text, size_t width) {
  if (width == 0) return text;
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line;
    // The items of a summary line are separated by two spaces: break between them.
    size_t at = start;
    while (at < end) {
      size_t sep = text.find("  ", at);
      if (sep == std::string::npos || sep > end) sep = end;
      const std::string item = text.substr(at, sep - at);
      if (!line.empty() && DisplayWidth(line) + 2 + DisplayWidth(item) > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : "  ") + item;
      at = sep == end ? end : sep + 2;
    }
    out += line + "\n";
    start = end + 1;
  }
  return out;
}

std::string Table::Render(size_t max_width) const {
  std::vector<size_t> widths(columns_.size(), 0);
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = DisplayWidth(columns_[c].header);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  const std::vector<size_t> natural = widths;
  std::vector<bool> shown(columns_.size(), true);
  auto total = [&] {
    size_t sum = 0, n = 0;
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (shown[c]) sum += widths[c], ++n;
    }
    return n == 0 ? 0 : sum + 2 * (n - 1);
  };
  // Narrower columns first (one cell at a time off the widest that may still shrink), then
  // fewer: each column left out gives the others their full width back before they shrink again.
  while (max_width > 0) {
    widths = natural;
    while (total() > max_width) {
      size_t widest = columns_.size();
      for (size_t c = 0; c < columns_.size(); ++c) {
        const size_t floor = std::max(columns_[c].min_width, DisplayWidth(columns_[c].header));
        if (!shown[c] || columns_[c].min_width == 0 || widths[c] <= floor) continue;
        if (widest == columns_.size() || widths[c] > widths[widest]) widest = c;
      }
      if (widest == columns_.size()) break;
      --widths[widest];
    }
    if (total() <= max_width) break;
    size_t victim = columns_.size();
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (!shown[c] || columns_[c].drop == 0) continue;
      if (victim == columns_.size() || columns_[c].drop >= columns_[victim].drop) victim = c;
    }
    if (victim == columns_.size()) break;  // only columns that always show: let it wrap
    shown[victim] = false;
  }
  size_t last_shown = 0;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (shown[c]) last_shown = c;
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    bool first = true;
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (!shown[c]) continue;
      if (!first) text += "  ";
      first = false;
      // Headers follow their column's alignment so they sit over the numbers.
      const Align align = columns_[c].align;
      const std::string cell = Truncate(cells[c], widths[c]);
      if (c == last_shown && align == Align::kLeft) {
        text += cell;
      } else {
        text += Pad(cell, widths[c], align);
      }
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text;
    out += '\n';
  };
  std::vector<std::string> headers;
  headers.reserve(columns_.size());
  for (const Column& column : columns_) headers.push_back(column.header);
  line(headers);
  for (const auto& row : rows_) line(row);
  return out;
}

namespace {

// Says how many session rows the daemon left out; empty when none.
std::string OmittedLine(uint64_t omitted) {
  if (omitted == 0) return "";
  return Num(omitted) + (omitted == 1 ? " session" : " sessions") +
         " not shown (a TCP listener serves node-level numbers only unless started with "
         "--listen-sessions; rows stop at 1024)\n";
}

}  // namespace

std::string WarmUpNote(const v1::DaemonStats& d) {
  if (d.warming()) return "  (tiers still warming: stashes into cold memory run slower)";
  // The latency and copy windows hold the last 4096 stashes; those made while the tiers warmed
  // are the earliest.
  constexpr uint64_t kWindow = 4096;
  const uint64_t pushed_out = d.stashes() > kWindow ? d.stashes() - kWindow : 0;
  if (d.stashes_while_warming() <= pushed_out) return "";
  return "  (includes " + Num(d.stashes_while_warming() - pushed_out) +
         " stashes made while the tiers warmed, until " + Printf("%.1f", d.warm_after_s()) +
         " s after start)";
}

std::string RenderStats(const v1::GetStatsResponse& stats, size_t width) {
  const v1::DaemonStats& d = stats.daemon();
  std::string out;
  out += "stashd " + OrDash(d.version()) + "  backend " + BackendName(d.backend()) + "  up " +
         FormatDuration(d.uptime_s()) + "  sessions " + Num(d.sessions_live()) + " live / " +
         Num(d.sessions_total()) + " total" + (d.draining() ? "  DRAINING" : "") + "\n";
  out += "stashes " + Num(d.stashes()) + "  reloads " + Num(d.reloads()) + "  releases " +
         Num(d.releases()) + "  stashed " + FormatBytes(d.bytes_stashed()) + "  reloaded " +
         FormatBytes(d.bytes_reloaded()) + "\n";
  out += "spills " + Num(d.spills()) + "  overflows " + Num(d.overflows()) + "  rejected " +
         Num(d.rejected()) + "\n";
  const bool measured = d.stashes() > 0;
  out += "stash latency p50 " + FormatLatencyUs(d.stash_latency_p50_us(), measured) + "  p99 " +
         FormatLatencyUs(d.stash_latency_p99_us(), measured) + "  copy: stash " +
         FormatGbps(d.stash_copy_gbps()) + "  reload " + FormatGbps(d.reload_copy_gbps()) +
         WarmUpNote(d) + "\n";
  out = FitLines(out, width);

  using A = Table::Align;
  Table tiers({{"TIER", A::kLeft},
               {"USAGE", A::kLeft},
               {"USED/TOTAL PAGES", A::kRight, 0, 5},
               {"USED / TOTAL BYTES", A::kRight},
               {"PAYLOAD BYTES", A::kRight, 0, 2},
               {"HIGH WATER PAGES", A::kRight, 0, 6},
               {"HIGH WATER BYTES", A::kRight, 0, 3},
               {"LIVE STASHES", A::kRight, 0, 1},
               {"LEASED/FREE/TOTAL CHUNKS", A::kRight, 0, 4}});
  for (const v1::TierStats& t : stats.tiers()) {
    tiers.AddRow({t.name(), UsageBar(t.pages_used(), t.pages_total()),
                  Num(t.pages_used()) + "/" + Num(t.pages_total()),
                  FormatBytes(t.pages_used() * t.page_bytes()) + " / " +
                      FormatBytes(t.pages_total() * t.page_bytes()),
                  FormatBytes(t.bytes_stashed()), Num(t.pages_high_water()),
                  FormatBytes(t.pages_high_water() * t.page_bytes()), Num(t.stashes_live()),
                  t.chunks_total() == 0 ? "-"
                                        : Num(t.chunks_leased()) + "/" + Num(t.chunks_free()) +
                                              "/" + Num(t.chunks_total())});
  }
  out += "\n";
  out += tiers.Render(width);
  // Host backend: pages and warmth, one line (stashd --huge-pages, --warm-memory).
  std::string pages, warming;
  for (const v1::TierStats& t : stats.tiers()) {
    if (t.page_kind().empty()) continue;
    if (pages.find(t.page_kind()) == std::string::npos) {
      pages += (pages.empty() ? "" : ", ") + t.page_kind();
    }
    const uint64_t bytes = t.pages_total() * t.page_bytes();
    if (t.bytes_warm() < bytes) {
      warming += "  " + t.name() + " " + FormatBytes(t.bytes_warm()) + " of " + FormatBytes(bytes);
    }
  }
  if (!pages.empty()) {
    out += FitLines("memory: " + pages +
                        (warming.empty() ? ", every tier warm" : "; warming:" + warming) + "\n",
                    width);
  }
  // Chunks neither in the pool nor leased, one line, when there are any.
  std::string held_out;
  for (const v1::TierStats& t : stats.tiers()) {
    std::string parts;
    auto add = [&parts](uint64_t n, const char* what) {
      if (n != 0) parts += (parts.empty() ? "" : ", ") + Num(n) + " " + what;
    };
    add(t.chunks_orphaned(), "orphaned (session ended, process lives)");
    add(t.chunks_kept(), "kept (returned by a live rank, until it exits)");
    add(t.chunks_waiting(), "waiting for memory");
    if (!parts.empty()) held_out += "  " + t.name() + ": " + parts;
  }
  if (!held_out.empty()) out += FitLines("chunks out of the pool:" + held_out + "\n", width);
  out += "\n";
  if (stats.sessions().empty() && stats.sessions_omitted() == 0) {
    out += "no sessions connected\n";
  } else {
    if (!stats.sessions().empty()) {
      out += SessionTable(stats.sessions(), /*with_identity=*/false, width);
    }
    out += OmittedLine(stats.sessions_omitted());
  }
  if (!stats.groups().empty()) out += "\n" + GroupTable(stats, width);
  return out;
}

namespace {

// Per session (`sessions --detail`): a mapped session's lease by tier, then what it holds by tag.
std::string SessionDetails(const google::protobuf::RepeatedPtrField<v1::SessionStats>& sessions,
                           size_t width) {
  std::string out;
  using A = Table::Align;
  for (const v1::SessionStats& s : sessions) {
    out += "\nsession " + OrDash(s.session_id().substr(0, 8)) + " (rank " + RankText(s.rank()) +
           ", pool " + std::to_string(s.pool()) + "): ";
    if (s.mode() == v1::MODE_MAPPED) {
      out += "mapped mode, lease by tier\n";
      Table lease({{"TIER", A::kLeft},
                   {"CHUNKS", A::kRight},
                   {"USED/LEASED PAGES", A::kRight},
                   {"HIGH WATER PAGES", A::kRight},
                   {"LAST STEP HIGH WATER PAGES", A::kRight},
                   {"TARGET PAGES", A::kRight}});
      for (const v1::LeaseStats& l : s.leases()) {
        lease.AddRow({LeaseTierName(l.tier()), Num(l.chunks()),
                      Num(l.pages_used()) + "/" + Num(l.pages_leased()), Num(l.pages_high_water()),
                      Num(l.last_step_high_water()),
                      l.pages_target() == 0 ? "fixed" : Num(l.pages_target())});
      }
      out += lease.Render(width);
    }
    // Mapped ranks list their stashes' tags in their control block; those that are in no row
    // of it are counted (live_untagged).
    if (s.live().empty() && s.live_untagged() == 0) {
      out += "holds no stashes\n";
      continue;
    }
    if (!s.live().empty()) {
      out += "live stashes by layer, microbatch and name\n";
      Table table({{"LAYER", A::kRight},
                   {"MICROBATCH", A::kRight},
                   {"NAME", A::kLeft, 12},
                   {"STASHES", A::kRight},
                   {"HELD BYTES", A::kRight},
                   {"HELD PAGES", A::kRight}});
      for (const v1::LiveStashes& l : s.live()) {
        table.AddRow({Num(l.layer()), Num(l.microbatch()), OrDash(l.name()), Num(l.stashes()),
                      FormatBytes(l.bytes()), Num(l.pages())});
      }
      out += table.Render(width);
    }
    if (s.live_untagged() > 0) {
      out += Num(s.live_untagged()) +
             " live stashes not in the rank's list of tags (it holds at most 448, or one was "
             "changing as the daemon read it)\n";
    }
  }
  return out;
}

}  // namespace

std::string RenderSessions(const google::protobuf::RepeatedPtrField<v1::SessionStats>& sessions,
                           uint64_t omitted, bool detail, size_t width) {
  if (sessions.empty() && omitted == 0) return "no sessions connected\n";
  std::string out;
  if (!sessions.empty()) out += SessionTable(sessions, /*with_identity=*/true, width);
  out += OmittedLine(omitted);
  if (!detail) return out;
  return out + SessionDetails(sessions, width);
}

std::string RenderGroups(const v1::GetStatsResponse& stats, bool detail, size_t width) {
  if (stats.groups().empty()) return "";
  std::string out = GroupTable(stats, width);
  if (detail) out += GroupDetails(stats, width);
  return out;
}

std::string RenderSessionsAndGroups(const v1::GetStatsResponse& stats, bool detail, size_t width) {
  std::string out = RenderSessions(stats.sessions(), stats.sessions_omitted(), detail, width);
  const std::string groups = RenderGroups(stats, detail, width);
  if (!groups.empty()) out += "\n" + groups;
  return out;
}

std::string RenderConfig(const v1::GetConfigResponse& config, size_t width) {
  std::string out;
  out += "stashd " + OrDash(config.version()) + "  backend " + BackendName(config.backend()) +
         "  socket " + OrDash(config.socket()) + "\n";
  const uint64_t page = config.page_bytes();
  out += "pools " + std::to_string(config.pools()) + " x " +
         FormatBytes(config.pool_pages() * page) + " (" + Num(config.pool_pages()) + " pages of " +
         FormatBytes(page) + ")  host tier ";
  if (config.host_tier_pages() == 0) {
    out += "none\n";
  } else {
    out += FormatBytes(config.host_tier_pages() * page) + " (" + Num(config.host_tier_pages()) +
           " pages)\n";
  }
  out += "metrics " + OrDash(config.metrics_url()) + "  tcp listener " +
         OrDash(config.tcp_listener()) + "\n";
  out = FitLines(out, width);
  using A = Table::Align;
  // The help is cut first (the full text: stashd --help), then left out.
  Table knobs({{"KNOB", A::kLeft},
               {"VALUE", A::kLeft, 16},
               {"SOURCE", A::kLeft},
               {"HELP", A::kLeft, 24, 1}});
  for (const v1::ConfigEntry& e : config.entries()) {
    knobs.AddRow({e.name(), e.value().empty() ? "\"\"" : e.value(), e.source(), e.help()});
  }
  out += "\n";
  out += knobs.Render(width);
  return out;
}

}  // namespace stash::stashctl
