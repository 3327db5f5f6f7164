#include "client/stashctl/select.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>
#include <utility>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

namespace stash::stashctl {

namespace pb = google::protobuf;

bool ValidSortKey(const std::string& key) {
  return key == "rank" || key == "pid" || key == "label" || key == "held";
}

void SelectSessions(const SessionSelection& selection,
                    pb::RepeatedPtrField<v1::SessionStats>* sessions) {
  if (selection.empty()) return;
  std::vector<v1::SessionStats> kept;
  for (v1::SessionStats& s : *sessions) {
    if (selection.rank && s.rank() != *selection.rank) continue;
    if (selection.pid && static_cast<int64_t>(s.pid()) != *selection.pid) continue;
    if (!selection.label.empty() &&
        fnmatch(selection.label.c_str(), s.label().c_str(), /*flags=*/0) != 0) {
      continue;
    }
    kept.push_back(std::move(s));
  }
  const std::string& key = selection.sort;
  std::stable_sort(kept.begin(), kept.end(),
                   [&key](const v1::SessionStats& a, const v1::SessionStats& b) {
                     if (key == "rank") return a.rank() < b.rank();
                     if (key == "pid") return a.pid() < b.pid();
                     if (key == "label") return a.label() < b.label();
                     if (key == "held") return a.bytes_live() > b.bytes_live();
                     return false;
                   });
  sessions->Clear();
  for (v1::SessionStats& s : kept) *sessions->Add() = std::move(s);
}

void SelectGroups(const SessionSelection& selection,
                  const pb::RepeatedPtrField<v1::SessionStats>& sessions,
                  pb::RepeatedPtrField<v1::GroupStats>* groups) {
  if (selection.label.empty() && !selection.rank && !selection.pid) return;
  std::set<std::string> shown;
  for (const v1::SessionStats& s : sessions) shown.insert(s.session_id());
  std::vector<v1::GroupStats> kept;
  for (v1::GroupStats& g : *groups) {
    const bool any = std::any_of(
        g.member_rows().begin(), g.member_rows().end(),
        [&shown](const v1::GroupMemberStats& m) { return shown.count(m.session_id()) > 0; });
    if (any) kept.push_back(std::move(g));
  }
  groups->Clear();
  for (v1::GroupStats& g : kept) *groups->Add() = std::move(g);
}

std::vector<std::string> QueryableFields(const pb::Descriptor& type) {
  std::vector<std::string> out;
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor* f = type.field(i);
    if (!f->is_repeated() && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      out.push_back(f->name());
    }
  }
  return out;
}

StatusOr<std::vector<std::string>> ResolveQuery(const pb::Descriptor& type,
                                                std::vector<std::string> fields) {
  const std::vector<std::string> valid = QueryableFields(type);
  if (fields.empty()) return valid;
  for (const std::string& field : fields) {
    if (std::find(valid.begin(), valid.end(), field) == valid.end()) {
      std::string list;
      for (const std::string& v : valid) list += (list.empty() ? "" : ",") + v;
      return InvalidArgumentError("--query: no field '" + field + "' in " + type.name() +
                                  "; the fields are " + list);
    }
  }
  return fields;
}

std::vector<std::string> CsvCells(const pb::Message& row, const std::vector<std::string>& fields) {
  const pb::Descriptor* type = row.GetDescriptor();
  const pb::Reflection* reflection = row.GetReflection();
  std::vector<std::string> cells;
  cells.reserve(fields.size());
  for (const std::string& name : fields) {
    const pb::FieldDescriptor* f = type->FindFieldByName(name);
    if (f == nullptr) {
      cells.emplace_back();
      continue;
    }
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        cells.push_back(std::to_string(reflection->GetInt32(row, f)));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        cells.push_back(std::to_string(reflection->GetInt64(row, f)));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        cells.push_back(std::to_string(reflection->GetUInt32(row, f)));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        cells.push_back(std::to_string(reflection->GetUInt64(row, f)));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.6g", reflection->GetDouble(row, f));
        cells.emplace_back(buf);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(reflection->GetFloat(row, f)));
        cells.emplace_back(buf);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        cells.emplace_back(reflection->GetBool(row, f) ? "true" : "false");
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        cells.push_back(reflection->GetEnum(row, f)->name());
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        cells.push_back(reflection->GetString(row, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        cells.emplace_back();  // ResolveQuery never lets one through
        break;
    }
  }
  return cells;
}

std::string CsvLine(const std::vector<std::string>& cells) {
  std::string out;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i > 0) out += ',';
    std::string cell = cells[i];
    // Control characters (a label a client chose) become '?', as in the tables.
    for (char& ch : cell) {
      const auto byte = static_cast<unsigned char>(ch);
      if (byte < 0x20 || byte == 0x7f) ch = '?';
    }
    if (cell.find_first_of(",\"\n") == std::string::npos) {
      out += cell;
      continue;
    }
    out += '"';
    for (char ch : cell) {
      if (ch == '"') out += '"';
      out += ch;
    }
    out += '"';
  }
  out += '\n';
  return out;
}

}  // namespace stash::stashctl
