// stash-bench --phases=sharing --quick end to end: 8 rank processes in lock step against real
// stashd daemons must meet the model exactly where the model knows the answer (daemon-copy:
// the same stashes overflow and spill, the pools' high water marks are the model's peaks), and
// the phase must exit 0. Execs $STASHD_BIN_DIR/bench/stash-bench (which starts stashd).
#include <stdlib.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> out;
  std::istringstream in(row);
  for (std::string cell; std::getline(in, cell, '|');) {
    const size_t a = cell.find_first_not_of(' ');
    const size_t b = cell.find_last_not_of(' ');
    out.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
  }
  return out;  // [0] is the empty text before the first '|'
}

// The row whose figure contains `what`: {figure, value, baseline, ratio}.
std::vector<std::string> Row(const std::string& table, const std::string& what) {
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> cells = Cells(line);
    if (cells.size() >= 6 && cells[2].find(what) != std::string::npos) {
      return {cells[2], cells[3], cells[4], cells[5]};
    }
  }
  ADD_FAILURE() << "no row with '" << what << "' in:\n" << table;
  return {"", "", "", ""};
}

// The text after `marker` up to `end` (or the end).
std::string After(const std::string& text, const std::string& marker, const std::string& end) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return "<no '" + marker + "' in '" + text + "'>";
  const size_t from = at + marker.size();
  return text.substr(from, end.empty() ? std::string::npos : text.find(end, from) - from);
}

TEST(SharingPhase, RankProcessesThroughStashdMeetTheModel) {
  const char* bin = std::getenv("STASHD_BIN_DIR");
  ASSERT_NE(bin, nullptr) << "run through ctest (STASHD_BIN_DIR)";
  char tmpl[] = "/tmp/sharing-phase-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string table_path = dir + "/table.md";
  const std::string command =
      std::string(bin) +
      "/bench/stash-bench --quick --phases=sharing --markdown-out=" + table_path +
      " --keep-dir=" + dir + "/logs > " + dir + "/stdout 2> " + dir + "/stderr";
  const int status = std::system(command.c_str());
  std::ifstream err(dir + "/stderr");
  const std::string stderr_text((std::istreambuf_iterator<char>(err)),
                                std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << stderr_text;
  std::ifstream in(table_path);
  const std::string table((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  // Per-rank pools of Megatron's size: the daemon overflows and spills exactly as the model.
  const auto own = Row(table, "8 pools of 1.10x avg-based peak (");
  EXPECT_EQ(own[1], After(own[2], "model ", "")) << own[0];
  // One shared pool, daemon-copy: the same.
  const auto shared = Row(table, "(a) daemon-copy, one shared pool");
  EXPECT_EQ(shared[1], After(shared[2], "; model ", "")) << shared[0];
  // Zero overflows: the shared pool's high water is the model's node peak; the per-rank pools'
  // summed high waters are the model's sum of per-rank peaks, and never below the shared one.
  const auto zero = Row(table, "(c) memory for zero overflows");
  EXPECT_EQ(zero[1], After(zero[0], "(model ", ")"));
  EXPECT_EQ(After(zero[2], "summed ", " ("), After(zero[2], "(model ", ")"));
  EXPECT_LE(std::stod(zero[3]), 1.0) << zero[3];
  // Mapped rows ran (their counts depend on lease timing: not compared with the model).
  EXPECT_NE(Row(table, "(b) mapped, automatic leases from the same pool")[1], "");
  // Mapped ranks in one group share the pool page by page: what daemon-copy's shared pool
  // overflows and spills, and nothing more.
  const auto grouped = Row(table, "(b) mapped, the 8 ranks in one group (page by page");
  EXPECT_EQ(grouped[1], shared[1]) << grouped[0];
  std::filesystem::remove_all(dir);
}

}  // namespace
