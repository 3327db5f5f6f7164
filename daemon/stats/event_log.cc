#include "daemon/stats/event_log.h"

#include "common/logging.h"

namespace stash::daemon {

EventLog& EventLog::Get() {
  static auto* const log = new EventLog();  // never destroyed: pool threads may log late
  return *log;
}

std::string EventLog::Describe(const SessionInfo& session, const stash::v1::Stash* stash) {
  std::string out = "session " + session.id.substr(0, 8);
  if (session.rank >= 0) out += " rank " + std::to_string(session.rank);
  out += " pool " + std::to_string(session.pool);
  if (!session.label.empty()) out += " label '" + session.label + "'";
  if (stash != nullptr) {
    out += " layer " + std::to_string(stash->layer()) + " microbatch " +
           std::to_string(stash->microbatch());
    if (!stash->name().empty()) out += " name '" + stash->name() + "'";
  }
  return out;
}

namespace {
std::string HeldBack(uint64_t n, const char* what) {
  return n == 0 ? std::string() : " (" + std::to_string(n) + " more " + what + " not logged)";
}

// What Describe says in words, as fields of the JSON line.
void AddFields(LogFields& fields, const SessionInfo& session, const stash::v1::Stash* stash) {
  fields.Add("session", session.id.substr(0, 8)).Add("pid", session.pid).Add("pool", session.pool);
  if (session.rank >= 0) fields.Add("rank", session.rank);
  if (!session.label.empty()) fields.Add("label", session.label);
  if (stash != nullptr) {
    fields.Add("layer", static_cast<int64_t>(stash->layer()))
        .Add("microbatch", static_cast<int64_t>(stash->microbatch()));
    if (!stash->name().empty()) fields.Add("name", stash->name());
  }
}
}  // namespace

void EventLog::Overflow(const SessionInfo& session, const stash::v1::Stash& stash, uint64_t rows) {
  uint64_t held = 0;
  if (!overflows_.Allow(RateLimiter::Clock::now(), &held)) return;
  LogFields fields;
  AddFields(fields, session, &stash);
  Log("events")->warn(
      "overflow: {}: {} rows of {} bytes found no room in the pool{}; the rank "
      "keeps its buffer{}",
      Describe(session, &stash), rows, stash.row_bytes(),
      session.allow_host_spill ? " or the host tier" : "", HeldBack(held, "overflows"));
}

void EventLog::Spill(const SessionInfo& session, const stash::v1::Stash& stash, uint64_t bytes,
                     const std::string& where) {
  uint64_t held = 0;
  if (!spills_.Allow(RateLimiter::Clock::now(), &held)) return;
  LogFields fields;
  AddFields(fields, session, &stash);
  Log("events")->info("spill: {}: {} bytes went to {} (pool full){}", Describe(session, &stash),
                      bytes, where, HeldBack(held, "spills"));
}

void EventLog::Reject(const SessionInfo& session, const stash::v1::SessionRequest& request,
                      const Status& status) {
  uint64_t held = 0;
  if (!rejects_.Allow(RateLimiter::Clock::now(), &held)) return;
  LogFields fields;
  AddFields(fields, session, request.has_stash() ? &request.stash() : nullptr);
  fields.Add("request", static_cast<int64_t>(request.request_id()));
  Log("events")->warn("reject: {}: request {}: {}{}",
                      Describe(session, request.has_stash() ? &request.stash() : nullptr),
                      request.request_id(), status.ToString(), HeldBack(held, "rejects"));
}

void EventLog::Mapped(const SessionInfo& session, uint64_t step, uint64_t overflows,
                      uint64_t spills, uint64_t rejected) {
  const std::string who = Describe(session, nullptr) + " (mapped)";
  const std::string by = " by step " + std::to_string(step);
  uint64_t held = 0;
  if (overflows > 0 && overflows_.Allow(RateLimiter::Clock::now(), &held)) {
    LogFields fields;
    AddFields(fields, session, nullptr);
    fields.Add("mode", "mapped").Add("step", static_cast<int64_t>(step));
    fields.Add("overflows", static_cast<int64_t>(overflows));
    Log("events")->warn(
        "overflow: {}: {} stashes found no room in the chunks leased to the session{}; the rank "
        "keeps those buffers{}",
        who, overflows, by, HeldBack(held, "overflows"));
  }
  if (spills > 0 && spills_.Allow(RateLimiter::Clock::now(), &held)) {
    LogFields fields;
    AddFields(fields, session, nullptr);
    fields.Add("mode", "mapped").Add("step", static_cast<int64_t>(step));
    fields.Add("spills", static_cast<int64_t>(spills));
    Log("events")->info(
        "spill: {}: {} stashes went outside the own device's chunks (peer or "
        "host){}{}",
        who, spills, by, HeldBack(held, "spills"));
  }
  if (rejected > 0 && rejects_.Allow(RateLimiter::Clock::now(), &held)) {
    LogFields fields;
    AddFields(fields, session, nullptr);
    fields.Add("mode", "mapped").Add("step", static_cast<int64_t>(step));
    fields.Add("rejected", static_cast<int64_t>(rejected));
    Log("events")->warn("reject: {}: {} operations answered with an error by the rank's copier{}{}",
                        who, rejected, by, HeldBack(held, "rejects"));
  }
}

}  // namespace stash::daemon
