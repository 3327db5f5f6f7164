// What of a reply stashctl shows: sessions filtered and sorted (--label, --rank, --pid, --sort),
// and rows as CSV with chosen fields (--query=FIELD,... --format=csv, like nvidia-smi's
// --query-gpu). Pure functions of the reply messages, so tests check them without a daemon.
#ifndef STASH_CLIENT_STASHCTL_SELECT_H_
#define STASH_CLIENT_STASHCTL_SELECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/message.h>
#include <google/protobuf/repeated_ptr_field.h>

#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::stashctl {

// Which sessions to show and in what order.
struct SessionSelection {
  std::string label;            // a shell glob (fnmatch: `llama-*`); "" = every label
  std::optional<int64_t> rank;  // only this rank
  std::optional<int64_t> pid;   // only this process
  // "" = the daemon's order (by rank); "rank", "pid", "label" ascending; "held" by held bytes,
  // largest first. Ties keep the daemon's order.
  std::string sort;

  bool empty() const { return label.empty() && !rank && !pid && sort.empty(); }
};

// The sort keys --sort accepts, for help and errors.
inline constexpr const char* kSortKeys = "rank, pid, label or held";
bool ValidSortKey(const std::string& key);

// Removes the sessions `selection` does not match and orders the rest, in place.
void SelectSessions(const SessionSelection& selection,
                    google::protobuf::RepeatedPtrField<v1::SessionStats>* sessions);

// With a filter (--label, --rank, --pid; not --sort alone), removes the groups none of whose
// members is among `sessions` (as SelectSessions left them), so `stashctl sessions --label=...`
// shows that job's group and not the others. Groups keep their order and every member row.
void SelectGroups(const SessionSelection& selection,
                  const google::protobuf::RepeatedPtrField<v1::SessionStats>& sessions,
                  google::protobuf::RepeatedPtrField<v1::GroupStats>* groups);

// The scalar fields of `type` a query may name (proto field names), in declaration order.
std::vector<std::string> QueryableFields(const google::protobuf::Descriptor& type);

// Checks `fields` against `type`: INVALID_ARGUMENT naming the unknown field and listing the
// valid ones. An empty list means every queryable field.
StatusOr<std::vector<std::string>> ResolveQuery(const google::protobuf::Descriptor& type,
                                                std::vector<std::string> fields);

// The rows as CSV: a header line of field names (unless `header` is false), then one line per
// row; enums by name, bools as true/false, a cell with a comma, quote or line break quoted.
// `fields` must come from ResolveQuery for the rows' type.
template <typename Row>
std::string RenderCsv(const google::protobuf::RepeatedPtrField<Row>& rows,
                      const std::vector<std::string>& fields, bool header);

// One row's cells, in `fields` order (RenderCsv's building block).
std::vector<std::string> CsvCells(const google::protobuf::Message& row,
                                  const std::vector<std::string>& fields);
std::string CsvLine(const std::vector<std::string>& cells);

template <typename Row>
std::string RenderCsv(const google::protobuf::RepeatedPtrField<Row>& rows,
                      const std::vector<std::string>& fields, bool header) {
  std::string out;
  if (header) out += CsvLine(fields);
  for (const Row& row : rows) out += CsvLine(CsvCells(row, fields));
  return out;
}

}  // namespace stash::stashctl

#endif  // STASH_CLIENT_STASHCTL_SELECT_H_
