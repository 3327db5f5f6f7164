// How stashctl shows the daemon's replies to people: aligned tables, usage bars, sizes, rates.
// Pure functions of the reply messages, so tests check them without a daemon.
#ifndef STASH_CLIENT_STASHCTL_FORMAT_H_
#define STASH_CLIENT_STASHCTL_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stash/v1/stash.pb.h"

namespace stash::stashctl {

// "[#######.............]  35%": `width` cells between the brackets, then the percentage right
// aligned in four characters. Rounds down, so the bar is full and "100%" shows only when
// used == total; any use at all shows at least one '#' and "<1%" rather than "0%". total == 0
// shows an empty bar and "  -%".
std::string UsageBar(uint64_t used, uint64_t total, int width = 20);

// "12s", "5m 03s", "2h 07m", "3d 04h": the two largest units, for uptimes and session ages.
std::string FormatDuration(double seconds);

// "3.2 us", "41 us", "503.4 ms", "12.0 s"; "-" when `valid` is false (nothing measured yet).
std::string FormatLatencyUs(double us, bool valid);

// A rate given in GB/s (1e9 bytes per second, as the protocol and its JSON have it) shown in the
// same unit: "12.4 GB/s", "524.3 MB/s"; "-" when zero (nothing measured yet).
std::string FormatGbps(double gbps);

// "host", "cuda" or "unspecified".
std::string BackendName(v1::Backend backend);

// A text table: a header row, then rows, columns separated by two spaces and padded to the
// widest cell. Numbers read best right-aligned, names left-aligned. Control characters in cells
// (a client chooses its own label) are shown as '?', so a cell cannot move the cursor. The last
// column is not padded, so no line ends in spaces.
//
// Rendered for a terminal of `max_width` cells, a table too wide first narrows the columns that
// may shrink (widest first, never below their min_width; a cut cell ends in '~'), then leaves
// out droppable columns (highest `drop` first, the rightmost of equals first) until it fits.
class Table {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
    // Cells may be cut down to this many cells (at least the header's width); 0 = never cut.
    size_t min_width = 0;
    // Left out when the table does not fit: higher goes first; 0 = always shown.
    int drop = 0;
  };

  explicit Table(std::vector<Column> columns);

  // A row with one cell per column; missing cells are empty, extra cells are dropped.
  void AddRow(std::vector<std::string> cells);

  size_t rows() const { return rows_.size(); }

  // The header line and one line per row, each ending in '\n'. max_width: the terminal's
  // width in cells; 0 = no limit.
  std::string Render(size_t max_width = 0) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// The width a terminal gives `text`: one cell per UTF-8 code point.
size_t DisplayWidth(std::string_view text);

// Each line of `text` longer than `width` cells broken between its items (separated by two
// spaces) into several; width 0 = unchanged.
std::string FitLines(const std::string& text, size_t width);

// `text` cut to `width` display cells, its last cell '~' when anything was cut.
std::string Truncate(const std::string& text, size_t width);

// The renderers' `width` is the terminal's (see Table::Render); 0 = no limit.

// What the latency line adds when its figures include a warm-up: the tiers still warming, or
// how many of the window's stashes were made while they warmed; empty otherwise.
std::string WarmUpNote(const v1::DaemonStats& d);

// The daemon lines, the tier table, the session table and the groups table (without detail) of
// `stashctl stats`.
std::string RenderStats(const v1::GetStatsResponse& stats, size_t width = 0);

// The session table alone (`stashctl sessions`); a line saying there are none when empty, and
// one saying how many the daemon left out (`omitted`) when it did. With `detail`, then per
// session what it holds now by layer, microbatch and name.
std::string RenderSessions(const google::protobuf::RepeatedPtrField<v1::SessionStats>& sessions,
                           uint64_t omitted = 0, bool detail = false, size_t width = 0);

// What `stashctl sessions` shows of a GetStats reply: RenderSessions of its sessions, then
// RenderGroups; with `detail`, each session's details come before the groups' table.
std::string RenderSessionsAndGroups(const v1::GetStatsResponse& stats, bool detail = false,
                                    size_t width = 0);

// The groups table (mapped sessions of one job sharing memory page by page): per group its name,
// uid, members, the bytes of the chunks it holds (each tier's pages times that tier's page_bytes
// in `stats.tiers`), the pages its members claim now / at most, its depot misses and the chunks
// it is giving back. With `detail`, then per group its chunks by tier and each member's pages by
// kind. Empty when the reply has no group, so a node without them reads as before.
std::string RenderGroups(const v1::GetStatsResponse& stats, bool detail = false, size_t width = 0);

// The daemon's identity, pools and geometry, then the knob table (`stashctl config`).
std::string RenderConfig(const v1::GetConfigResponse& config, size_t width = 0);

}  // namespace stash::stashctl

#endif  // STASH_CLIENT_STASHCTL_FORMAT_H_
