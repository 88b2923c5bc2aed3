// The acceptance lab: every check id of spec/acceptance.md, run against real
// imserver processes, a real PostgreSQL and real WebSocket connections.
// Each check returns a verdict with a detail; a check that throws FAILs with
// the exception text. Nothing here fakes a part of the system.
#pragma once

#include "harness.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace im::lab {

using namespace im::test;
namespace json = boost::json;
using namespace std::chrono_literals;

/// A check's outcome: PASS, or FAIL at the tag of the assertion that failed,
/// with a one-line detail.
struct Verdict {
    bool pass = false;
    std::string detail;
    std::string tag; // on FAIL: which assertion failed (a short stable slug)
};
inline Verdict passed(std::string detail) { return {true, std::move(detail), {}}; }
inline Verdict failed(std::string tag, std::string detail) { return {false, std::move(detail), std::move(tag)}; }

/// Thrown by expect(): the check FAILs at `tag` with this text. Only this
/// exception is an assertion of a check; a control passes only on it (at its
/// control_tag).
struct CheckFailed : std::runtime_error {
    CheckFailed(std::string t, const std::string& what) : std::runtime_error(what), tag(std::move(t)) {}
    std::string tag;
};
/// The lab could not do what the check needs (a refused POST /lab/fault, a
/// process that does not start, a reply the check did not assert on): not
/// a verdict on the server. A check with a harness error FAILs; a control
/// with one DID NOT FAIL. Any exception other than CheckFailed counts as one.
struct HarnessError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
/// One assertion of a check: `tag` names what is asserted ("one-row",
/// "dup-true", ...), stable across runs; `what` says what was seen.
inline void expect(bool ok, const std::string& tag, const std::string& what) {
    if (!ok) throw CheckFailed(tag, what);
}

/// Shared parts of one lab run: one PostgreSQL cluster, one gateway started
/// with --enable-faults (faults are armed per check through POST /lab/fault),
/// provisioning through the real admin CLI, assertions on real rows.
class Lab {
public:
    Lab();
    ~Lab();

    TestPostgres& pg() { return *pg_; }
    const std::string& db() const { return db_; }
    /// The shared gateway (faults enabled, none armed).
    ServerProcess& server() { return *server_; }

    /// A new user with one device (unique name from prefix).
    TestUser user(const std::string& prefix);
    /// A new conversation (unique id from prefix) with these members, in order:
    /// N members give join events at seq 1..N.
    std::string conv(const std::string& prefix, const std::string& kind, const std::vector<TestUser>& members);

    /// Rows of one request key in events.
    std::int64_t rows(const std::string& conv, const std::string& sender, const std::string& cmid,
                      const std::string& database = "im");
    /// The conversation's head as stored (next_seq - 1).
    std::int64_t head(const std::string& conv, const std::string& database = "im");
    std::string sql(const std::string& q, const std::string& database = "im") { return pg_->scalar(q, database); }

    /// Arms a fault on a gateway started with --enable-faults.
    static void arm(ServerProcess& s, const std::string& spec);

    /// Processes the watchdog must stop if a check hangs.
    void track(ServerProcess* s);
    void untrack(ServerProcess* s);
    void track(TestPostgres* p);
    void untrack(TestPostgres* p);
    void kill_all_tracked();

private:
    std::unique_ptr<TestPostgres> pg_;
    std::string db_;
    std::unique_ptr<ServerProcess> server_;
    std::mutex mu_;
    std::vector<ServerProcess*> servers_;
    std::vector<TestPostgres*> clusters_;
};

/// RAII: registers a server/cluster with the lab's watchdog.
template <class T>
struct Tracked {
    Lab& lab;
    std::unique_ptr<T> p;
    template <class... A>
    explicit Tracked(Lab& l, A&&... a) : lab(l), p(std::make_unique<T>(std::forward<A>(a)...)) { lab.track(p.get()); }
    ~Tracked() { lab.untrack(p.get()); }
    T* operator->() { return p.get(); }
    T& operator*() { return *p; }
};

// ----------------------------------------------------------------- frames

/// Reply type, or the error code for error frames ("sent", "NOT_MEMBER", "timeout", "closed").
std::string outcome(const json::object& reply);
/// Asserts at tag "reply" that `reply` is an answer the check can judge:
/// not "timeout", "closed", `UNAVAILABLE` or an error code outside the
/// contract's list. Checks call it before they
/// assert on a value, so a lost reply never lands on the value's tag.
const json::object& answered(const json::object& reply, const std::string& what);
/// WsClient::wait_push, but when no matching push came it asserts at tag
/// "connection-open" that the connection is still open: a closed socket
/// never lands on the tag of a missing push.
std::optional<json::object> awaited_push(WsClient& ws, const std::function<bool(const json::object&)>& pred,
                                         std::chrono::milliseconds timeout, const std::string& what);
bool flag(const json::object& o, const char* key);
std::string quote(const std::string& s); // SQL literal

/// Connects and says hello (the shared login()); fails at tag "welcome" unless the reply is `welcome`.
std::unique_ptr<WsClient> connect(unsigned short port, const std::string& token, const std::string& install = {});
json::object send(WsClient& ws, const std::string& conv, const std::string& cmid, const std::string& body,
                  std::chrono::milliseconds timeout = 10s);
json::object sync(WsClient& ws, const std::string& conv, std::int64_t after, std::int64_t limit = 50,
                  std::optional<std::int64_t> epoch = std::nullopt);
/// Syncs from `after` until has_more is false; returns the seqs applied in
/// order. Fails at tag "sync-page" on a reply that is not a page.
std::vector<std::int64_t> sync_all(WsClient& ws, const std::string& conv, std::int64_t after = 0,
                                   std::int64_t limit = 50, std::int64_t* head = nullptr);
/// "sent seq 3, dup:false" style summary of a reply.
std::string brief(const json::object& reply);

// ----------------------------------------------------------------- checks

/// A check id and how to run it. `control`, when set, is its negative
/// control: the same check against a deliberately broken part (a lab-only
/// server switch, or a client test double that breaks the guarded property).
/// The lab runs it after the check, every run, and requires it to FAIL at
/// exactly `control_tag` (the assertion that guards the broken property):
/// `CONTROL <id> failed as expected at <tag>`; a pass, a failure at another
/// tag or a harness error is `CONTROL <id> DID NOT FAIL (...)` and fails the
/// run. `control_what` says in a few words what it breaks.
/// A further negative control of a check (Check::more): run like `control`.
struct Control {
    std::function<Verdict(Lab&)> run;
    std::string what;
    std::string tag;
};
struct Check {
    std::string id;
    std::function<Verdict(Lab&)> run;
    std::function<Verdict(Lab&)> control = {};
    std::string control_what = {};
    std::string control_tag = {};
    /// Controls beyond the first, each printing its own CONTROL line: where
    /// the first breaks the test's client, these break the server.
    std::vector<Control> more = {};
};
/// A negative control: `check` run while the shared gateway breaks one rule of
/// the contract (the rule.* fault point armed with `skip`, disarmed after).
std::function<Verdict(Lab&)> breaking(const std::string& rule, std::function<Verdict(Lab&)> check);

std::vector<Check> send_checks();      // 04-*
std::vector<Check> fault_checks();     // lab-faults-off-by-default, 06-*
std::vector<Check> sync_checks();      // 07-*, 08-*
std::vector<Check> device_checks();    // 09-*, 10-*
std::vector<Check> retention_checks(); // 11-*
std::vector<Check> crash_checks();     // lab-crash-*: fault points beyond send
std::vector<Check> change_checks();    // 12-*: replies, edits, reactions
std::vector<Check> ephemeral_checks(); // 13-*: typing and presence
std::vector<Check> moderation_checks(); // 14-*: rate limits and moderation (checks_moderation.cpp)
std::vector<Check> webhook_checks();   // 14-webhook-*

/// Path of the SDK child program, or empty when the SDK was not built.
std::string sdk_child_bin();
/// Points IMSERVER_BIN / IM_SDK_CHILD_BIN at the binaries built with this
/// program, unless the environment already names others.
void use_built_binaries();

} // namespace im::lab
