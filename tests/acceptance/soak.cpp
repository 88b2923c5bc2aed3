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
//     server's msg/join/leave events of the conversation, nothing pending)
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
    std::string conv, sender, cmid, mid;
    std::int64_t seq = 0;
};

// An SDK child whose stdout is read continuously by its own thread.
struct SdkClient {
    std::unique_ptr<Child> child;
    std::thread reader;
    std::mutex mu;
    std::vector<std::string> lines;
    std::atomic<bool> drained{false}, done{false};
    std::string user, db;
    void start(std::vector<std::string> argv) {
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
    ~SdkClient() {
        if (child) child->kill9();
        if (reader.joinable()) reader.join();
    }
};

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
    std::printf("soak: %ld s, seed %u\n", seconds, seed);
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
            for (int n = 0; !stop; ++n) {
                const std::string conv = convs[rng() % convs.size()], cmid = uuid4();
                const std::string body = "raw-" + std::to_string(i) + "-" + std::to_string(n);
                for (;;) {
                    if (Clock::now() > hard_stop) {
                        bad.add(raw[i].user + ": key " + cmid + " never answered");
                        return;
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
                    auto r = send(*ws, conv, cmid, body, 5s);
                    auto o = outcome(r);
                    if (o == "sent") {
                        AckedSend a{conv, raw[i].user, cmid, str(r, "mid"), num(r, "seq")};
                        if (a.seq <= last[conv])
                            bad.add(raw[i].user + ": out of order in " + conv + ": seq " + std::to_string(a.seq) +
                                    " after " + std::to_string(last[conv]));
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
                        std::lock_guard lk(acked_mu);
                        acked.push_back(std::move(a));
                        break;
                    }
                    ++resends;
                    if (o == "UNAVAILABLE") ++unavailable;
                    else if (o == "timeout") ++timeouts;
                    else if (o == "closed") g ^= 1;
                    else {
                        bad.add(raw[i].user + ": terminal reply " + brief(r) + " for " + cmid);
                        return;
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 150));
                }
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
        c->start({sdk_bin, "soak", c->db, urls, sdk[i].token, convs[0], std::to_string(sdk_count)});
        clients.push_back(std::move(c));
    }

    // ---- chaos: random faults all along, one database restart, one SIGKILL.
    std::mt19937 rng(seed ^ 0x9e3779b9u);
    long crashes = 0, drops = 0, unavails = 0, kills = 0, db_restarts = 0;
    bool did_db = false, did_kill = false;
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
    for (auto& c : clients) {
        std::vector<std::string> lines;
        {
            std::lock_guard lk(c->mu);
            lines = c->lines;
        }
        std::int64_t prev = 0;
        std::string rows;
        for (const auto& l : lines) {
            if (l.rfind("CMID ", 0) == 0) {
                ++sdk_sent;
                auto it = stored.find(convs[0] + "|" + c->user + "|" + l.substr(5));
                if (it == stored.end()) {
                    bad.add(c->user + ": SDK draft " + l.substr(5) + " is not on the server");
                    continue;
                }
                if (it->second.first <= prev)
                    bad.add(c->user + ": SDK sends out of order: seq " + std::to_string(it->second.first) + " after " +
                            std::to_string(prev));
                prev = it->second.first;
            } else if (l.rfind("ROW ", 0) == 0) {
                rows += (rows.empty() ? "" : "\n") + row_key(l.substr(4));
            }
        }
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

    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t_start).count();
    std::ostringstream d;
    d << secs << " s, seed " << seed << ": " << acked.size() << " raw sends acknowledged (" << dup_checks
      << " answered keys resent -> dup:true, " << resends << " resends: " << unavailable << " UNAVAILABLE, "
      << timeouts << " timeouts, " << reconnects << " connections), " << sdk_sent << " SDK drafts from " << sdk_n
      << " SDK processes; chaos: " << crashes << " gateway crashes, " << drops << " drop_reply, " << unavails
      << " unavailable, " << db_restarts << " database restart, " << kills << " gateway SIGKILL; heads "
      << head[convs[0]] << " and " << head[convs[1]];
    if (!bad.list.empty()) {
        std::printf("SOAK FAIL (%s; %zu violations, first: %s)\n", d.str().c_str(), bad.list.size(),
                    bad.list.front().c_str());
        return 1;
    }
    std::printf("SOAK PASS (%s; keys unique, seqs gap-free, every acknowledged cmid once with its seq and mid, "
                "sends in order, SDK stores equal the server)\n",
                d.str().c_str());
    return 0;
}
