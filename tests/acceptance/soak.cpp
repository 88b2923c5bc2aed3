// im_soak: the invariant soak (docs/acceptance.md). Raw WebSocket senders
// and real SDK processes write into two conversations through two gateways
// while a chaos thread arms random crash / drop_reply / unavailable faults
// (restarting what crashed), restarts PostgreSQL once and SIGKILLs a gateway
// once. Then a checker goes over the database and every client's store:
//   - at most one event per request key
//   - seqs gap-free 1..head per conversation
//   - every acknowledged cmid present exactly once (raw: with the acked seq
//     and mid; SDK: every cmid send() returned)
//   - each sender's sends in order (raw senders live; SDK by final seqs)
//   - every SDK client converged to the server's state (its rows = the
//     server's msg/join/leave events of the conversation, nothing pending;
//     its recalled messages = the server's recall targets)
//   - counted by body (every body of the run is unique): no message stored
//     twice (a double, e.g. resent under a new cmid), none the clients never
//     asked for (an extra), none acknowledged but missing; the same for
//     recalls (by key and target)
//   - every read marker between the highest answered and the highest asked
//     `read`; every event a `history` page showed equals the stored one
// Beside sends, the raw senders recall some of their messages, move their
// read markers and page `history`; the chaos thread also SIGKILLs one SDK
// process once and restarts it on its SQLite file. The seed is printed
// first and in the verdict; `--seed S` replays a run's choices (the timing
// of a real system is not replayed).
//
//   im_soak [--seconds N | --minutes N] [--seed S] [--sdk-clients N]
//           (default 60 s, 2 SDK clients; ctest runs 45 s, see
//           docs/acceptance.md)
// Prints `SOAK PASS (...)` or `SOAK FAIL (...)` lines; exit status 1 on any
// violation.
#include "child.hpp"
#include "lab.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

using namespace im::lab;
using Clock = std::chrono::steady_clock;

namespace {

struct Violations {
    std::mutex mu;
    std::vector<std::string> list;
    void add(const std::string& v) {
        std::lock_guard lk(mu);
        if (list.size() < 50) list.push_back(v);
        std::printf("VIOLATION %s\n", v.c_str());
        std::fflush(stdout);
    }
};

struct AckedSend {
    std::string conv, sender, cmid, mid, body;
    std::int64_t seq = 0;
};

// A recall a raw sender asked for, with its answer (seq 0: none judged;
// expired: RECALL_WINDOW_EXPIRED, so no recall event may exist for it).
struct AskedRecall {
    std::string conv, sender, cmid;
    std::int64_t target = 0, seq = 0;
    bool expired = false;
};

// What the clients asked for and saw, besides acknowledged sends.
struct Asked {
    std::mutex mu;
    std::set<std::string> bodies;                     // every body a client tried to send
    std::vector<AskedRecall> recalls;
    std::map<std::string, std::int64_t> read_answered, read_asked; // conv|user -> highest
    std::map<std::string, std::string> seen;          // conv|seq -> what a history page showed
    long reads = 0, histories = 0, history_events = 0;
};

// An SDK child whose stdout is read continuously by its own thread.
struct SdkClient {
    std::unique_ptr<Child> child;
    std::thread reader;
    std::mutex mu;
    std::vector<std::string> lines;
    std::atomic<bool> drained{false}, done{false};
    std::string user, db;
    int incarnation = 0;
    void start(std::vector<std::string> argv) {
        ++incarnation;
        child = std::make_unique<Child>(argv);
        reader = std::thread([this] {
            for (;;) {
                auto l = child->line(1h);
                if (!l) break;
                std::lock_guard lk(mu);
                lines.push_back(*l);
                if (*l == "DRAINED") drained = true;
                if (*l == "DONE") done = true;
            }
        });
    }
    /// SIGKILL, then the same program on the same SQLite file.
    void restart(std::vector<std::string> argv) {
        child->kill9();
        if (reader.joinable()) reader.join();
        start(std::move(argv));
    }
    long cmids() {
        std::lock_guard lk(mu);
        long n = 0;
        for (const auto& l : lines) n += l.rfind("CMID ", 0) == 0;
        return n;
    }
    ~SdkClient() {
        if (child) child->kill9();
        if (reader.joinable()) reader.join();
    }
};

// What an event shows: the body of a msg, the target of a recall, the kind of the rest.
std::string shows(const json::object& ev) {
    std::string kind = str(ev, "kind");
    if (kind == "msg") return "msg " + str(ev, "body");
    if (kind == "recall") return "recall " + std::to_string(num(ev, "target"));
    return kind;
}

// "SEQ KIND BODY" with the body kept for msg rows only (a join/leave row's
// text is the client's own rendering).
std::string row_key(const std::string& line) {
    std::istringstream in(line);
    std::string seq, kind;
    in >> seq >> kind;
    if (kind != "msg") return seq + " " + kind;
    auto at = line.find(' ', line.find(' ') + 1);
    return seq + " msg " + (at == std::string::npos ? std::string() : line.substr(at + 1));
}

} // namespace

int main(int argc, char** argv) {
    use_built_binaries();
    long seconds = 60;
    int sdk_n = 2;
    unsigned seed = static_cast<unsigned>(std::random_device{}());
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> long {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return std::strtol(argv[++i], nullptr, 10);
        };
        if (a == "--seconds") seconds = next();
        else if (a == "--minutes") seconds = next() * 60;
        else if (a == "--seed") seed = static_cast<unsigned>(next());
        else if (a == "--sdk-clients") sdk_n = static_cast<int>(next());
        else {
            std::fprintf(stderr, "usage: im_soak [--seconds N | --minutes N] [--seed S] [--sdk-clients N]\n");
            return 2;
        }
    }
    if (seconds < 10 || sdk_n < 0 || sdk_n > 8) {
        std::fprintf(stderr, "im_soak: at least 10 seconds, 0..8 SDK clients\n");
        return 2;
    }
    const std::string sdk_bin = sdk_child_bin();
    if (sdk_n > 0 && (sdk_bin.empty() || !std::filesystem::exists(sdk_bin))) {
        std::printf("SOAK FAIL (the SDK child was not built: the soak needs real SDK clients)\n");
        return 1;
    }
    std::printf("soak: %ld s, seed %u (replay: im_soak --seconds %ld --seed %u --sdk-clients %d)\n", seconds, seed,
                seconds, seed, sdk_n);
    std::fflush(stdout);
    const auto t_start = Clock::now();

    TestPostgres pg;
    const std::string url = pg.url();
    const int raw_n = 3;
    std::vector<TestUser> raw, sdk;
    std::string members;
    for (int i = 0; i < raw_n; ++i) raw.push_back(make_user(url, unique_name("raw")));
    for (int i = 0; i < sdk_n; ++i) sdk.push_back(make_user(url, unique_name("sdk")));
    for (auto* v : {&raw, &sdk})
        for (auto& u : *v) members += (members.empty() ? "" : ",") + u.user;
    const std::vector<std::string> convs{unique_name("soak-a"), unique_name("soak-b")};
    for (auto& c : convs) admin_ok(url, {"conv", "create", c, "--kind", "group", "--members", members});

    std::vector<std::unique_ptr<ServerProcess>> gw;
    for (int g = 0; g < 2; ++g)
        gw.push_back(std::make_unique<ServerProcess>(url, std::vector<std::string>{"--enable-faults", "--quiet"},
                                                     unique_name("gw-soak-" + std::to_string(g))));
    const unsigned short ports[2] = {gw[0]->port(), gw[1]->port()};
    const std::string urls = gw[0]->url() + "," + gw[1]->url();

    Violations bad;
    std::atomic<bool> stop{false};
    std::mutex acked_mu;
    std::vector<AckedSend> acked;
    std::atomic<long> resends{0}, dup_checks{0}, unavailable{0}, timeouts{0}, reconnects{0};
    Asked asked;

    // ---- raw senders: one request outstanding at a time, resent with the
    // same key until answered; sometimes resent again after the answer.
    std::vector<std::thread> senders;
    for (int i = 0; i < raw_n; ++i) {
        senders.emplace_back([&, i] {
            std::mt19937 rng(seed + static_cast<unsigned>(i));
            std::unique_ptr<WsClient> ws;
            int g = i % 2;
            std::map<std::string, std::int64_t> last; // conv -> last acked seq (in-order check)
            const auto hard_stop = Clock::now() + std::chrono::seconds(seconds) + 120s;
            const std::string& me = raw[i].user;
            // One request, resent as it is until it gets an answer (not
            // UNAVAILABLE, no timeout, no closed socket); nothing on the hard stop.
            auto until_answered = [&](const json::object& request, const std::string& what) -> std::optional<json::object> {
                for (;;) {
                    if (Clock::now() > hard_stop) {
                        bad.add(me + ": " + what + " never answered");
                        return std::nullopt;
                    }
                    if (!ws || ws->closed()) {
                        ws.reset();
                        try {
                            ws = connect(ports[g], raw[i].token);
                            ++reconnects;
                        } catch (const std::exception&) {
                            g ^= 1; // the other gateway
                            std::this_thread::sleep_for(100ms);
                            continue;
                        }
                    }
                    auto r = ws->request(request, 5s);
                    auto o = outcome(r);
                    if (o != "UNAVAILABLE" && o != "timeout" && o != "closed") return r;
                    ++resends;
                    if (o == "UNAVAILABLE") ++unavailable;
                    else if (o == "timeout") ++timeouts;
                    else g ^= 1;
                    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 150));
                }
            };
            // One attempt, for the requests that need no retry (read, history).
            auto once = [&](const json::object& request) -> std::optional<json::object> {
                if (!ws || ws->closed()) return std::nullopt;
                auto r = ws->request(request, 5s);
                auto o = outcome(r);
                if (o == "UNAVAILABLE" || o == "timeout" || o == "closed") return std::nullopt;
                return r;
            };
            for (int n = 0; !stop; ++n) {
                const std::string conv = convs[rng() % convs.size()], cmid = uuid4();
                const std::string body = "raw-" + std::to_string(i) + "-" + std::to_string(n);
                {
                    std::lock_guard lk(asked.mu);
                    asked.bodies.insert(body);
                }
                auto r = until_answered({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}}, "key " + cmid);
                if (!r) return;
                if (outcome(*r) != "sent") {
                    bad.add(me + ": terminal reply " + brief(*r) + " for " + cmid);
                    return;
                }
                AckedSend a{conv, me, cmid, str(*r, "mid"), body, num(*r, "seq")};
                if (a.seq <= last[conv])
                    bad.add(me + ": out of order in " + conv + ": seq " + std::to_string(a.seq) + " after " +
                            std::to_string(last[conv]));
                last[conv] = a.seq;
                if (rng() % 5 == 0) { // a random resend of an answered key
                    auto again = send(*ws, conv, cmid, body, 5s);
                    if (outcome(again) == "sent") {
                        ++dup_checks;
                        if (!flag(again, "dup") || num(again, "seq") != a.seq || str(again, "mid") != a.mid)
                            bad.add("resend of " + cmid + " -> " + brief(again) + ", original seq " +
                                    std::to_string(a.seq));
                    }
                }
                {
                    std::lock_guard lk(acked_mu);
                    acked.push_back(a);
                }
                const unsigned pick = rng() % 12;
                if (pick == 0) { // recall the message just sent, under its own key, until answered
                    AskedRecall rc{conv, me, uuid4(), a.seq};
                    auto rr = until_answered({{"t", "recall"}, {"conv", conv}, {"target", a.seq}, {"cmid", rc.cmid}},
                                             "recall " + rc.cmid);
                    if (!rr) return;
                    if (outcome(*rr) == "recalled") rc.seq = num(*rr, "seq");
                    else if (outcome(*rr) == "RECALL_WINDOW_EXPIRED") rc.expired = true;
                    else bad.add(me + ": recall of " + conv + " seq " + std::to_string(a.seq) + " -> " + brief(*rr));
                    std::lock_guard lk(asked.mu);
                    asked.recalls.push_back(rc);
                } else if (pick <= 2) { // move the read marker to what this sender last saw
                    const std::string key = conv + "|" + me;
                    {
                        std::lock_guard lk(asked.mu);
                        auto& hi = asked.read_asked[key];
                        hi = std::max(hi, a.seq);
                    }
                    if (auto rd = once({{"t", "read"}, {"conv", conv}, {"seq", a.seq}})) {
                        std::lock_guard lk(asked.mu);
                        ++asked.reads;
                        auto& hi = asked.read_answered[key];
                        if (outcome(*rd) != "read_ok" || num(*rd, "read") < a.seq || num(*rd, "read") < hi)
                            bad.add(me + ": read " + conv + " " + std::to_string(a.seq) + " -> " + brief(*rd) +
                                    " (answered before: " + std::to_string(hi) + ")");
                        else hi = num(*rd, "read");
                    }
                } else if (pick <= 4) { // the newest window, as an app opens a conversation
                    if (auto h = once({{"t", "history"}, {"conv", conv}, {"before", 0}, {"limit", 20}})) {
                        if (outcome(*h) != "page") {
                            bad.add(me + ": history " + conv + " -> " + brief(*h));
                        } else {
                            const auto& evs = h->at("events").as_array();
                            std::int64_t prev = 0;
                            std::lock_guard lk(asked.mu);
                            ++asked.histories;
                            for (const auto& v : evs) {
                                const auto& ev = v.as_object();
                                const auto seq = num(ev, "seq");
                                // Every member joined at creation: the window is gap-free.
                                if (prev && seq != prev + 1)
                                    bad.add(me + ": history " + conv + " jumps from " + std::to_string(prev) + " to " +
                                            std::to_string(seq));
                                prev = seq;
                                ++asked.history_events;
                                auto [it, fresh] = asked.seen.emplace(conv + "|" + std::to_string(seq), shows(ev));
                                if (!fresh && it->second != shows(ev))
                                    bad.add(me + ": history " + conv + " seq " + std::to_string(seq) + " showed '" +
                                            shows(ev) + "', earlier '" + it->second + "'");
                            }
                            if (prev && prev != num(*h, "head"))
                                bad.add(me + ": history " + conv + " ends at " + std::to_string(prev) + ", head " +
                                        std::to_string(num(*h, "head")));
                        }
                    }
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));
            }
        });
    }

    // ---- SDK clients: real im::Client processes over both gateways.
    TempDir dir("imsoak");
    const int sdk_count = static_cast<int>(seconds * 7); // one per 100 ms for ~70% of the soak
    std::vector<std::unique_ptr<SdkClient>> clients;
    for (int i = 0; i < sdk_n; ++i) {
        auto c = std::make_unique<SdkClient>();
        c->user = sdk[i].user;
        c->db = dir.path() + "/sdk" + std::to_string(i) + ".db";
        c->start({sdk_bin, "soak", c->db, urls, sdk[i].token, convs[0], std::to_string(sdk_count), "k1-"});
        clients.push_back(std::move(c));
    }

    // ---- chaos: random faults all along, one database restart, one SIGKILL.
    std::mt19937 rng(seed ^ 0x9e3779b9u);
    long crashes = 0, drops = 0, unavails = 0, kills = 0, db_restarts = 0, sdk_kills = 0;
    bool did_db = false, did_kill = false, did_sdk_kill = sdk_n == 0;
    auto ensure_up = [&](int g) {
        if (gw[g]->wait_exit(0ms)) gw[g]->restart_on_same_port();
    };
    // Arming a gateway races the crash armed before it: a gateway that dies
    // under the request is a crash like any other (restarted, counted), not
    // a failure of the system under test.
    auto arm = [&](int g, const char* what) {
        try {
            Lab::arm(*gw[g], what);
        } catch (const std::exception&) {
            if (!gw[g]->wait_exit(10s)) throw;
            ++crashes;
            gw[g]->restart_on_same_port();
        }
    };
    const auto t_end = t_start + std::chrono::seconds(seconds);
    try {
        while (Clock::now() < t_end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1500 + rng() % 2500));
            const double frac = std::chrono::duration<double>(Clock::now() - t_start).count() / double(seconds);
            const int g = static_cast<int>(rng() % 2);
            if (!did_db && frac > 0.4) {
                did_db = true;
                pg.stop_immediate();
                std::this_thread::sleep_for(1500ms);
                pg.start();
                ++db_restarts;
                continue;
            }
            if (!did_sdk_kill && frac > 0.55) {
                // An SDK process dies (SIGKILL) mid-traffic and comes back on
                // its SQLite file: what send() returned must still land once.
                did_sdk_kill = true;
                const auto k = static_cast<std::size_t>(rng() % static_cast<unsigned>(sdk_n));
                auto& c = *clients[k];
                const long left = std::max(0L, static_cast<long>(sdk_count) - c.cmids());
                c.restart({sdk_bin, "soak", c.db, urls, sdk[k].token, convs[0], std::to_string(left),
                           "k" + std::to_string(c.incarnation + 1) + "-"});
                ++sdk_kills;
                continue;
            }
            if (!did_kill && frac > 0.7) {
                did_kill = true;
                gw[g]->kill();
                std::this_thread::sleep_for(500ms);
                gw[g]->restart_on_same_port();
                ++kills;
                continue;
            }
            switch (rng() % 4) {
            case 0:
            case 1: {
                const char* point = rng() % 2 ? "store.before_commit=crash:1" : "api.after_send_commit=crash:1";
                arm(g, point);
                if (gw[g]->wait_exit(10s)) {
                    ++crashes;
                    gw[g]->restart_on_same_port();
                } else {
                    arm(g, "off");
                }
                break;
            }
            case 2:
                arm(g, "api.after_send_commit=drop_reply:2");
                ++drops;
                break;
            default:
                arm(g, "store.before_insert=unavailable:3");
                ++unavails;
                break;
            }
        }
        for (int g = 0; g < 2; ++g) {
            ensure_up(g);
            arm(g, "off");
        }
    } catch (const std::exception& e) {
        bad.add(std::string("chaos: ") + e.what());
        for (int g = 0; g < 2; ++g) {
            try {
                ensure_up(g);
                Lab::arm(*gw[g], "off");
            } catch (...) {
            }
        }
    }
    stop = true;
    for (auto& t : senders) t.join();
    const auto t_chaos_end = Clock::now();

    // ---- the SDK clients finish: drain, sync, report their rows.
    // Drain first (every client), then the last sync: a client that synced
    // while another still drained would miss the other's last messages.
    for (auto& c : clients) std::ofstream(c->db + ".end") << "end\n";
    const auto sdk_deadline = Clock::now() + 180s;
    for (auto& c : clients) {
        while (!c->drained && Clock::now() < sdk_deadline) std::this_thread::sleep_for(100ms);
        if (!c->drained) bad.add(c->user + ": the SDK client did not drain its outbox in 180 s: " +
                                 c->child->stderr_text());
    }
    const auto t_drained = Clock::now();
    for (auto& c : clients) std::ofstream(c->db + ".sync") << "sync\n";
    const auto sync_deadline = Clock::now() + 120s;
    for (auto& c : clients) {
        while (c->drained && !c->done && Clock::now() < sync_deadline) std::this_thread::sleep_for(100ms);
        if (c->drained && !c->done)
            bad.add(c->user + ": the SDK client did not sync in 120 s: " + c->child->stderr_text());
    }
    if (sdk_n > 0)
        std::printf("soak: SDK clients drained %.1f s after the chaos, synced %.1f s later\n",
                    std::chrono::duration<double>(t_drained - t_chaos_end).count(),
                    std::chrono::duration<double>(Clock::now() - t_drained).count());

    // ---- the checker, over the database.
    auto sql = [&](const std::string& q) { return pg.scalar(q); };
    auto dup_keys = sql("SELECT count(*) FROM (SELECT 1 FROM events WHERE client_msg_id IS NOT NULL "
                        "GROUP BY conv_id, sender_user, client_msg_id HAVING count(*) > 1) d");
    if (dup_keys != "0") bad.add(dup_keys + " request keys with more than one event");
    std::map<std::string, std::int64_t> head;
    for (auto& c : convs) {
        auto h = std::stoll(sql("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + quote(c)));
        head[c] = h;
        auto stats = sql("SELECT count(*) || ' ' || COALESCE(min(seq), 0) || ' ' || COALESCE(max(seq), 0) "
                         "FROM events WHERE conv_id = " + quote(c));
        if (stats != std::to_string(h) + " 1 " + std::to_string(h))
            bad.add(c + ": seqs not gap-free 1.." + std::to_string(h) + " (count min max: " + stats + ")");
    }
    // Every event of the soak's keys, to compare acknowledgements with.
    std::map<std::string, std::pair<std::int64_t, std::string>> stored; // conv|sender|cmid -> seq, mid
    {
        std::string rows = sql("SELECT string_agg(conv_id || '|' || sender_user || '|' || client_msg_id || '|' || "
                               "seq || '|' || mid::text, E'\\n') FROM events WHERE client_msg_id IS NOT NULL");
        std::istringstream in(rows);
        for (std::string line; std::getline(in, line);) {
            auto p3 = line.rfind('|'), p2 = line.rfind('|', p3 - 1);
            stored[line.substr(0, p2)] = {std::stoll(line.substr(p2 + 1, p3 - p2 - 1)), line.substr(p3 + 1)};
        }
    }
    for (const auto& a : acked) {
        auto it = stored.find(a.conv + "|" + a.sender + "|" + a.cmid);
        if (it == stored.end()) bad.add("acknowledged " + a.cmid + " (seq " + std::to_string(a.seq) + ") is missing");
        else if (it->second.first != a.seq || it->second.second != a.mid)
            bad.add("acknowledged " + a.cmid + " seq " + std::to_string(a.seq) + " is stored at seq " +
                    std::to_string(it->second.first));
    }
    // The SDK clients: every cmid send() returned is stored exactly once, in
    // send order, and the client's rows equal the server's.
    // The server's rows of convs[0] as a member who joined at seq `from` sees them.
    auto server_rows_from = [&](const std::string& user) {
        std::string out;
        std::istringstream in(sql("SELECT string_agg(seq || ' ' || kind || ' ' || COALESCE(body, ''), E'\\n' "
                                  "ORDER BY seq) FROM events WHERE conv_id = " + quote(convs[0]) +
                                  " AND kind IN ('msg', 'join', 'leave') AND seq >= (SELECT min(from_seq) FROM "
                                  "membership_periods WHERE conv_id = " + quote(convs[0]) + " AND user_id = " +
                                  quote(user) + ")"));
        for (std::string line; std::getline(in, line);) out += (out.empty() ? "" : "\n") + row_key(line);
        return out;
    };
    long sdk_sent = 0;
    std::set<std::string> sdk_asked, sdk_confirmed; // bodies: tried / send() returned a cmid
    for (auto& c : clients) {
        std::vector<std::string> lines;
        {
            std::lock_guard lk(c->mu);
            lines = c->lines;
        }
        std::int64_t prev = 0;
        std::string rows, recalled;
        for (const auto& l : lines) {
            if (l.rfind("ASK ", 0) == 0) {
                sdk_asked.insert(l.substr(4));
            } else if (l.rfind("CMID ", 0) == 0) {
                ++sdk_sent;
                const auto sp = l.find(' ', 5);
                const std::string cmid = l.substr(5, sp == std::string::npos ? std::string::npos : sp - 5);
                if (sp != std::string::npos) sdk_confirmed.insert(l.substr(sp + 1));
                auto it = stored.find(convs[0] + "|" + c->user + "|" + cmid);
                if (it == stored.end()) {
                    bad.add(c->user + ": SDK draft " + cmid + " is not on the server");
                    continue;
                }
                if (it->second.first <= prev)
                    bad.add(c->user + ": SDK sends out of order: seq " + std::to_string(it->second.first) + " after " +
                            std::to_string(prev));
                prev = it->second.first;
            } else if (l.rfind("ROW ", 0) == 0) {
                rows += (rows.empty() ? "" : "\n") + row_key(l.substr(4));
            } else if (l.rfind("RECALLED ", 0) == 0) {
                recalled += (recalled.empty() ? "" : ",") + l.substr(9);
            }
        }
        // The recalls the SDK applied: its recalled messages are the server's recall targets.
        const std::string server_recalled = sql(
            "SELECT COALESCE(string_agg(target_seq::text, ',' ORDER BY target_seq), '') FROM events WHERE conv_id = " +
            quote(convs[0]) + " AND kind = 'recall' AND target_seq >= (SELECT min(from_seq) FROM membership_periods "
            "WHERE conv_id = " + quote(convs[0]) + " AND user_id = " + quote(c->user) + ")");
        if (c->done && recalled != server_recalled)
            bad.add(c->user + ": SDK recalled seqs '" + recalled + "' vs the server's recall targets '" +
                    server_recalled + "'");
        const std::string server_rows = server_rows_from(c->user);
        if (c->done && rows != server_rows) {
            // First difference, for the report.
            std::istringstream a(rows), b(server_rows);
            std::string la, lb;
            int n = 0;
            while (true) {
                bool ga = static_cast<bool>(std::getline(a, la)), gb = static_cast<bool>(std::getline(b, lb));
                ++n;
                if (!ga && !gb) break;
                if (!ga || !gb || la != lb) {
                    bad.add(c->user + ": SDK store differs from the server at row " + std::to_string(n) + ": '" +
                            (ga ? la : "<end>") + "' vs server '" + (gb ? lb : "<end>") + "'");
                    break;
                }
            }
        }
    }

    // ---- by body: every body of the run is unique, so a message stored
    // twice (under a new key: the key check above cannot see it) is a body
    // counted twice, and a message nobody asked for is a body not asked.
    std::map<std::string, long> body_rows;
    {
        std::istringstream in(sql("SELECT string_agg(body || E'\\t' || n, E'\\n') FROM (SELECT body, count(*) AS n "
                                  "FROM events WHERE kind = 'msg' GROUP BY body) b"));
        for (std::string line; std::getline(in, line);) {
            auto tab = line.rfind('\t');
            if (tab != std::string::npos) body_rows[line.substr(0, tab)] = std::stol(line.substr(tab + 1));
        }
    }
    std::set<std::string> must_have = sdk_confirmed, asked_bodies = sdk_asked;
    for (const auto& a : acked) must_have.insert(a.body);
    asked_bodies.insert(asked.bodies.begin(), asked.bodies.end());
    long doubles = 0, extras = 0, missing = 0, stored_msgs = 0;
    for (const auto& [body, n] : body_rows) {
        stored_msgs += n;
        if (n > 1) {
            ++doubles;
            bad.add("body '" + body + "' stored " + std::to_string(n) + " times (a double)");
        }
        if (!asked_bodies.count(body)) {
            ++extras;
            bad.add("body '" + body + "' stored but never asked for (an extra)");
        }
    }
    for (const auto& b : must_have)
        if (!body_rows.count(b)) {
            ++missing;
            bad.add("body '" + b + "' acknowledged but not stored");
        }
    // Recalls: each asked key stored once at its answered seq (none for an
    // expired one), no recall nobody asked for, at most one per target.
    long recall_rows = 0, recall_doubles = 0, recall_extras = 0, recall_missing = 0;
    {
        std::map<std::string, std::vector<std::string>> rows_by_key; // conv|sender|cmid -> "seq target"
        std::map<std::string, long> per_target;
        std::istringstream in(sql("SELECT string_agg(conv_id || '|' || sender_user || '|' || client_msg_id || ' ' || "
                                  "seq || ' ' || target_seq, E'\\n') FROM events WHERE kind = 'recall'"));
        for (std::string line; std::getline(in, line);) {
            std::istringstream f(line);
            std::string key, seq, target;
            f >> key >> seq >> target;
            rows_by_key[key].push_back(seq + " " + target);
            ++recall_rows;
            auto conv = key.substr(0, key.find('|'));
            if (++per_target[conv + " " + target] == 2) {
                ++recall_doubles;
                bad.add(conv + ": seq " + target + " recalled more than once");
            }
        }
        std::set<std::string> asked_keys;
        for (const auto& rc : asked.recalls) {
            const std::string key = rc.conv + "|" + rc.sender + "|" + rc.cmid;
            asked_keys.insert(key);
            auto it = rows_by_key.find(key);
            const std::size_t n = it == rows_by_key.end() ? 0 : it->second.size();
            if (rc.expired ? n != 0 : n != 1) {
                ++(n > 1 ? recall_doubles : recall_missing);
                bad.add("recall " + key + " of seq " + std::to_string(rc.target) + ": " + std::to_string(n) +
                        " events" + (rc.expired ? " (answered RECALL_WINDOW_EXPIRED)" : ""));
            } else if (n == 1 && it->second.front() != std::to_string(rc.seq) + " " + std::to_string(rc.target)) {
                bad.add("recall " + key + " answered seq " + std::to_string(rc.seq) + " target " +
                        std::to_string(rc.target) + ", stored '" + it->second.front() + "'");
            }
        }
        for (const auto& [key, v] : rows_by_key)
            if (!asked_keys.count(key)) {
                ++recall_extras;
                bad.add("recall " + key + " stored but never asked for");
            }
    }
    // Read markers: between the highest answered and the highest asked.
    for (const auto& [key, hi] : asked.read_asked) {
        const auto bar = key.find('|');
        const auto v = sql("SELECT read FROM read_markers WHERE conv_id = " + quote(key.substr(0, bar)) +
                           " AND user_id = " + quote(key.substr(bar + 1)));
        const std::int64_t marker = v.empty() ? 0 : std::stoll(v);
        const std::int64_t lo = asked.read_answered.count(key) ? asked.read_answered.at(key) : 0;
        if (marker < lo || marker > hi)
            bad.add(key + ": read marker " + std::to_string(marker) + ", answered up to " + std::to_string(lo) +
                    ", asked up to " + std::to_string(hi));
    }
    // What history pages showed is what is stored.
    {
        std::map<std::string, std::string> db_shows;
        std::istringstream in(sql("SELECT string_agg(conv_id || '|' || seq || E'\\t' || kind || CASE kind WHEN 'msg' "
                                  "THEN ' ' || body WHEN 'recall' THEN ' ' || target_seq ELSE '' END, E'\\n') "
                                  "FROM events"));
        for (std::string line; std::getline(in, line);) {
            auto tab = line.find('\t');
            if (tab != std::string::npos) db_shows[line.substr(0, tab)] = line.substr(tab + 1);
        }
        for (const auto& [at, what] : asked.seen) {
            auto it = db_shows.find(at);
            if (it == db_shows.end() || it->second != what)
                bad.add("history showed " + at + " as '" + what + "', stored '" +
                        (it == db_shows.end() ? std::string("<none>") : it->second) + "'");
        }
    }

    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t_start).count();
    std::ostringstream d;
    d << secs << " s, seed " << seed << ": " << acked.size() << " raw sends acknowledged (" << dup_checks
      << " answered keys resent -> dup:true, " << resends << " resends: " << unavailable << " UNAVAILABLE, "
      << timeouts << " timeouts, " << reconnects << " connections), " << sdk_sent << " SDK drafts from " << sdk_n
      << " SDK processes; chaos: " << crashes << " gateway crashes, " << drops << " drop_reply, " << unavails
      << " unavailable, " << db_restarts << " database restart, " << kills << " gateway SIGKILL, " << sdk_kills
      << " SDK SIGKILL; heads " << head[convs[0]] << " and " << head[convs[1]] << "; bodies: "
      << asked_bodies.size() << " asked, " << stored_msgs << " msg events stored, " << doubles << " doubles, "
      << extras << " extras, " << missing << " missing; recalls: " << asked.recalls.size() << " asked, "
      << recall_rows << " stored, " << recall_doubles << " doubles, " << recall_extras << " extras, "
      << recall_missing << " missing; " << asked.reads << " reads answered, " << asked.histories
      << " history pages (" << asked.history_events << " events compared)";
    if (!bad.list.empty()) {
        std::printf("SOAK FAIL (%s; %zu violations, first: %s)\n", d.str().c_str(), bad.list.size(),
                    bad.list.front().c_str());
        std::printf("soak: replay with im_soak --seconds %ld --seed %u --sdk-clients %d\n", seconds, seed, sdk_n);
        return 1;
    }
    std::printf("SOAK PASS (%s; keys unique, seqs gap-free, every acknowledged cmid once with its seq and mid, "
                "every body once and none unasked, recalls once each, read markers and history pages as stored, "
                "sends in order, SDK stores equal the server)\n",
                d.str().c_str());
    return 0;
}
