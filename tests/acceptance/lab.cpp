#include "lab.hpp"

#include "exe_relative.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>

#include <signal.h>

namespace im::lab {

Lab::Lab() {
    pg_ = std::make_unique<TestPostgres>();
    db_ = pg_->url();
    track(pg_.get());
    server_ = std::make_unique<ServerProcess>(db_, std::vector<std::string>{"--enable-faults", "--quiet",
                                              // webhooks: only the gateways 14-webhook-at-least-once starts deliver
                                              "--webhook-workers", "0"},
                                              unique_name("gw-lab"));
    track(server_.get());
}

Lab::~Lab() {
    untrack(server_.get());
    server_.reset();
    untrack(pg_.get());
}

TestUser Lab::user(const std::string& prefix) { return make_user(db_, unique_name(prefix)); }

std::string Lab::conv(const std::string& prefix, const std::string& kind, const std::vector<TestUser>& members) {
    std::string id = unique_name(prefix), list;
    for (const auto& m : members) list += (list.empty() ? "" : ",") + m.user;
    admin_ok(db_, {"conv", "create", id, "--kind", kind, "--members", list});
    return id;
}

std::int64_t Lab::rows(const std::string& conv, const std::string& sender, const std::string& cmid,
                       const std::string& database) {
    return std::stoll(sql("SELECT count(*) FROM events WHERE conv_id = " + quote(conv) +
                              " AND sender_user = " + quote(sender) + " AND client_msg_id = " + quote(cmid),
                          database));
}

std::int64_t Lab::head(const std::string& conv, const std::string& database) {
    auto v = sql("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + quote(conv), database);
    return v.empty() ? -1 : std::stoll(v);
}

void Lab::arm(ServerProcess& s, const std::string& spec) {
    auto [status, body] = s.http("POST", "/lab/fault", spec);
    if (status != 200) throw HarnessError("POST /lab/fault " + spec + " -> " + std::to_string(status) + " " + body);
}

std::function<Verdict(Lab&)> breaking(const std::string& rule, std::function<Verdict(Lab&)> check) {
    return [rule, check](Lab& lab) {
        Lab::arm(lab.server(), rule + "=skip");
        struct Disarm {
            Lab& lab;
            std::string spec;
            ~Disarm() {
                try {
                    Lab::arm(lab.server(), spec);
                } catch (...) {
                }
            }
        } disarm{lab, rule + "=off"};
        return check(lab);
    };
}

void Lab::track(ServerProcess* s) {
    std::lock_guard lk(mu_);
    servers_.push_back(s);
}
void Lab::untrack(ServerProcess* s) {
    std::lock_guard lk(mu_);
    servers_.erase(std::remove(servers_.begin(), servers_.end(), s), servers_.end());
}
void Lab::track(TestPostgres* p) {
    std::lock_guard lk(mu_);
    clusters_.push_back(p);
}
void Lab::untrack(TestPostgres* p) {
    std::lock_guard lk(mu_);
    clusters_.erase(std::remove(clusters_.begin(), clusters_.end(), p), clusters_.end());
}

void Lab::kill_all_tracked() {
    // Called by the watchdog or a fatal-signal handler: signal only, no
    // reaping; never block on a lock the interrupted code may hold.
    std::unique_lock lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) return;
    for (auto* s : servers_)
        if (s->pid() > 0) ::kill(s->pid(), SIGKILL);
    for (auto* p : clusters_) {
        try {
            p->stop_immediate();
        } catch (...) {
        }
    }
}

// ----------------------------------------------------------------- frames

std::string outcome(const json::object& reply) {
    std::string t = str(reply, "t");
    return t == "error" ? str(reply, "code") : t;
}

const json::object& answered(const json::object& reply, const std::string& what) {
    auto o = outcome(reply);
    expect(o != "timeout" && o != "closed" && o != "UNAVAILABLE", "reply", what + ": no answer (" + brief(reply) + ")");
    // A stray error (a code outside contract section 8) is no answer either.
    static const std::set<std::string> codes{"INVALID_ARGUMENT", "UNAUTHENTICATED", "NOT_MEMBER",
                                             "IDEMPOTENCY_MISMATCH", "ORIGINAL_EXPIRED", "NOT_SENDER",
                                             "ALREADY_RECALLED", "RECALL_WINDOW_EXPIRED", "EDIT_WINDOW_EXPIRED", "NOT_FOUND",
                                             "CURSOR_AHEAD", "EPOCH_CHANGED", "STALE_INSTALL",
                                             "RATE_LIMITED", "MUTED"};
    expect(str(reply, "t") != "error" || codes.count(o) == 1, "reply",
           what + ": an error code outside the contract (" + brief(reply) + ")");
    return reply;
}

std::optional<json::object> awaited_push(WsClient& ws, const std::function<bool(const json::object&)>& pred,
                                         std::chrono::milliseconds timeout, const std::string& what) {
    auto p = ws.wait_push(pred, timeout);
    if (!p) expect(!ws.closed(), "connection-open", what + ": the connection closed while waiting for a push");
    return p;
}

bool flag(const json::object& o, const char* key) {
    auto* v = o.if_contains(key);
    return v && v->is_bool() && v->get_bool();
}

std::string quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
}

std::unique_ptr<WsClient> connect(unsigned short port, const std::string& token, const std::string& install) {
    try {
        return login(port, token, install);
    } catch (const HelloRefused& e) { // a verdict at "welcome", not a harness error
        throw CheckFailed("welcome", e.what());
    }
}

json::object send(WsClient& ws, const std::string& conv, const std::string& cmid, const std::string& body,
                  std::chrono::milliseconds timeout) {
    return ws.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}}, timeout);
}

json::object sync(WsClient& ws, const std::string& conv, std::int64_t after, std::int64_t limit,
                  std::optional<std::int64_t> epoch) {
    json::object o{{"t", "sync"}, {"conv", conv}, {"after", after}, {"limit", limit}};
    if (epoch) o["epoch"] = *epoch;
    return ws.request(o);
}

std::vector<std::int64_t> sync_all(WsClient& ws, const std::string& conv, std::int64_t after, std::int64_t limit,
                                   std::int64_t* head) {
    std::vector<std::int64_t> seqs;
    for (int pages = 0; pages < 10000; ++pages) {
        auto p = sync(ws, conv, after, limit);
        if (str(p, "t") != "page") throw CheckFailed("sync-page", "sync after " + std::to_string(after) + " -> " + brief(p));
        for (const auto& e : p.at("events").as_array()) seqs.push_back(e.as_object().at("seq").as_int64());
        after = num(p, "next_after");
        if (head) *head = num(p, "head");
        if (!flag(p, "has_more")) return seqs;
    }
    throw CheckFailed("sync-finished", "sync did not finish");
}

std::string brief(const json::object& r) {
    std::string t = str(r, "t");
    if (t == "sent")
        return "sent seq " + std::to_string(num(r, "seq")) + ", dup:" + (flag(r, "dup") ? "true" : "false");
    if (t == "recalled")
        return "recalled seq " + std::to_string(num(r, "seq")) + ", dup:" + (flag(r, "dup") ? "true" : "false");
    if (t == "error") return str(r, "code") + " \"" + str(r, "msg") + "\"";
    std::string s = json::serialize(r);
    return s.size() > 160 ? s.substr(0, 160) + "..." : s;
}

void use_built_binaries() {
#ifdef IM_DEFAULT_IMSERVER_BIN
    ::setenv("IMSERVER_BIN", im::test::exe_relative(IM_DEFAULT_IMSERVER_BIN).c_str(), 0);
#endif
#ifdef IM_DEFAULT_SDK_CHILD_BIN
    ::setenv("IM_SDK_CHILD_BIN", im::test::exe_relative(IM_DEFAULT_SDK_CHILD_BIN).c_str(), 0);
#endif
}

std::string sdk_child_bin() {
    const char* p = std::getenv("IM_SDK_CHILD_BIN");
    return p && *p ? std::string(p) : std::string();
}

} // namespace im::lab
