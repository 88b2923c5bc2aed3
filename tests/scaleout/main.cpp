// The scale-out lab (docs/scaling.md): real HAProxy, real gateways, real SDK
// clients, PostgreSQL under Patroni with etcd. Each scenario prints
//   PASS <name> (<figures>)   or   FAIL <name> (<what went wrong>)
// and the lab exits non-zero when any scenario failed.
//
//   im_scaleout [SCENARIO...]     default: all of them
//
// IM_SCALEOUT_ROUNDS=N (default 1, ctest's) repeats the rolling restart of
// all three gateways N times and fails over N times (the killed node
// rejoins as the standby between failovers): the longer run of
// docs/scaling.md.
//
// Scenarios:
//   bus-postgres      pushes across gateways in seq order; LISTEN sessions
//                     terminated -> every subscriber gets resync
//   bus-nats          the same with --bus nats://DEAD,nats://LIVE (a list
//                     with a node that is down); nats-server killed and
//                     started again -> every subscriber gets resync
//   rolling-restart   3 gateways behind HAProxy, SIGTERM + restart each in
//                     turn under send traffic from SDK clients
//   rolling-restart-nats  the same with the NATS bus
//   admin-nats        the admin CLI with --bus nats://...: joins, epoch bumps
//                     and revocations reach gateways that listen only to
//                     NATS; /readyz follows the NATS connection; a revocation
//                     committed while NATS is down closes the device's
//                     connections once the bus is back; a send while NATS
//                     is down answers UNAVAILABLE, and its resend once the
//                     bus is back leaves one row for the key
//   patroni-failover  the same fleet on a Patroni primary + synchronous
//                     standby; SIGKILL the primary's node under traffic;
//                     the clients must have seen UNAVAILABLE and resent
//   webhook-failover  14-webhook-at-least-once across a database failover:
//                     two gateways deliver to a receiver that answers 500,
//                     disappears, comes back holding a delivery while the
//                     gateway delivering it is SIGKILLed and Patroni fails
//                     the database over; every committed event delivered at
//                     least once, in seq order per conversation, signed, and
//                     nothing that is not in the events table after
//   webhook-failover-control  its negative control: the same with the
//                     gateways' rule.webhook_retry=skip (a failed delivery
//                     moves the cursor on without a 2xx), the gateway killed
//                     but no database failover (single PostgreSQL): passes
//                     when the check above catches events never delivered
#include "fleet.hpp"
#include "natsserver.hpp"
#include "patroni.hpp"
#include "webhook_receiver.hpp"

#include <algorithm>
#include <cstdio>
#include <pqxx/pqxx>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

using namespace im::scaleout;
namespace test = im::test;

namespace {

struct Outcome {
    bool pass;
    std::string detail;
};

long ms_since(Clock::time_point t) {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

// IM_SCALEOUT_ROUNDS: how often the rolling restart and the failover repeat.
int rounds() {
    const char* v = std::getenv("IM_SCALEOUT_ROUNDS");
    if (!v || !*v) return 1;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end || n < 1 || n > 100) throw std::runtime_error(std::string("IM_SCALEOUT_ROUNDS: expected 1..100, got ") + v);
    return static_cast<int>(n);
}

// "min-max ms (median m)" of a scenario's repeated timings.
std::string spread(std::vector<long> ms) {
    std::sort(ms.begin(), ms.end());
    std::ostringstream o;
    o << ms.front() << "-" << ms.back() << " ms (median " << ms[ms.size() / 2] << ")";
    return o.str();
}

// Common gateway flags: quick drain so a rolling restart takes seconds.
std::vector<std::string> gateway_flags(std::vector<std::string> extra = {}) {
    std::vector<std::string> f = {"--quiet", "--drain-timeout-ms", "5000", "--db-pool", "2", "--io-threads", "1"};
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
}

std::vector<test::World> make_worlds(const std::string& db, const std::string& prefix) {
    // Two conversations of two members each: four SDK clients, and every
    // conversation has members on (usually) different gateways.
    return {test::make_world(db, prefix + "a", 2), test::make_world(db, prefix + "b", 2)};
}

// `extra` may add problems of its own to the verdict (a scenario's own demand).
Outcome judge(const std::string& db, Clients& clients, std::ostringstream& figures,
              const std::function<void(Verdict&)>& extra = {}) {
    clients.stop_and_converge(180s);
    auto v = verify(db, clients);
    if (extra) extra(v);
    figures << v.summary();
    if (v.ok()) return {true, figures.str()};
    std::string detail = figures.str();
    for (std::size_t i = 0; i < v.problems.size() && i < 8; ++i) detail += "; " + v.problems[i];
    return {false, detail};
}

// Runs a scenario on a fleet; a failure (a verdict or an exception) carries
// the gateways' own warnings, so a failure seen once in a long run can be
// explained from its report (the gateways' logs go with their temporary
// directories).
Outcome on_fleet(Fleet& fleet, const std::function<Outcome()>& scenario) {
    Outcome o;
    try {
        o = scenario();
    } catch (const std::exception& e) {
        o = {false, e.what()};
    }
    if (!o.pass) o.detail += fleet.warnings();
    return o;
}

Outcome rolling_restart_on(Fleet& fleet, const std::string& db, const LabEnv& env, const std::string& label);

Outcome rolling_restart(const LabEnv& env, const std::string& label, const std::vector<std::string>& bus_flags,
                        const std::function<std::string()>& db_url) {
    std::string db = db_url();
    Fleet fleet(env, db, gateway_flags(bus_flags));
    return on_fleet(fleet, [&] { return rolling_restart_on(fleet, db, env, label); });
}

Outcome rolling_restart_on(Fleet& fleet, const std::string& db, const LabEnv& env, const std::string& label) {
    Clients clients(env, fleet.ws_url(), make_worlds(db, label), 40);
    clients.wait_each_acked(5, 120s);
    std::vector<long> drained, back;
    const int n = rounds();
    for (int round = 1; round <= n; ++round)
        for (std::size_t i = 0; i < fleet.size(); ++i) {
            auto t0 = Clock::now();
            int rc = fleet.gateway(i).terminate(30s);
            drained.push_back(ms_since(t0));
            if (rc != 0)
                return {false, "round " + std::to_string(round) + ": gw" + std::to_string(i + 1) + " exited " +
                                   std::to_string(rc) + " on SIGTERM"};
            fleet.gateway(i).restart();
            wait_until([&] { return fleet.status(i) == "UP"; }, 60s, "HAProxy to see the restarted gateway UP");
            back.push_back(ms_since(t0));
            // Traffic must flow again before the next gateway goes.
            auto before = clients.total_acked();
            wait_until([&] { return clients.total_acked() >= before + 20; }, 60s, "sends to be acknowledged again");
        }
    std::ostringstream figures;
    figures << drained.size() << " restarts in " << n << (n == 1 ? " round" : " rounds") << ": drained "
            << spread(drained) << ", UP again " << spread(back) << "; ";
    auto outcome = judge(db, clients, figures);
    // Every client was on one of the restarted gateways: each must have moved.
    for (const auto& r : clients.runs()) {
        auto f = facts_of(r);
        if (f.gateways.size() < 2) {
            outcome.pass = false;
            outcome.detail += "; " + r.user + " never moved to another gateway";
        }
    }
    return outcome;
}

// After a `resync` push: does a sync of `conv` after seq - 1 start with
// `seq`? Empty when it does, else the page it got (contract: a subscriber
// told to resync catches up by sync).
std::string sync_lacks(test::WsClient& c, const std::string& conv, std::int64_t seq) {
    auto page = c.request({{"t", "sync"}, {"conv", conv}, {"after", seq - 1}});
    const auto* evs = page.if_contains("events");
    if (evs && !evs->as_array().empty() && evs->as_array().front().as_object().at("seq").as_int64() == seq) return {};
    return test::json::serialize(page);
}

// The bus, seen from the clients: a sender on gw1, watchers on gw2 and gw3.
// Pushes cross gateways, arrive in seq order without gaps, and when the bus
// connection is cut and comes back every watcher gets `resync` and pushes
// flow again. `cut` breaks the bus of every gateway and returns what it did.
Outcome bus_checks_on(Fleet& fleet, const std::string& db, const std::string& label,
                      const std::function<std::string(const std::string&)>& cut);

Outcome bus_checks(const LabEnv& env, const std::string& label, const std::vector<std::string>& bus_flags,
                   const std::function<std::string()>& db_url, const std::function<std::string(const std::string&)>& cut) {
    const std::string db = db_url();
    Fleet fleet(env, db, gateway_flags(bus_flags));
    return on_fleet(fleet, [&] { return bus_checks_on(fleet, db, label, cut); });
}

Outcome bus_checks_on(Fleet& fleet, const std::string& db, const std::string& label,
                      const std::function<std::string(const std::string&)>& cut) {
    auto w = test::make_world(db, label, 3);
    std::vector<std::unique_ptr<test::WsClient>> c;
    for (std::size_t i = 0; i < 3; ++i) {
        c.push_back(std::make_unique<test::WsClient>(fleet.gateway(i).port()));
        auto welcome = c.back()->hello(w.users[i].token);
        if (test::str(welcome, "t") != "welcome") return {false, "hello: " + test::json::serialize(welcome)};
        if (test::str(c.back()->request({{"t", "sub"}}), "t") != "subscribed") return {false, "sub refused"};
    }
    // Pipelined sends: each is published after its own COMMIT, so the bus
    // may deliver them out of order; the watchers must not see that.
    const int n = 40;
    for (int i = 1; i <= n; ++i)
        c[0]->send_json({{"t", "send"}, {"rid", "s" + std::to_string(i)}, {"conv", w.conv},
                         {"cmid", "k" + std::to_string(i)}, {"body", "m" + std::to_string(i)}});
    const std::int64_t first = 4, last = 3 + n; // seqs 1..3 are the joins
    std::ostringstream figures;
    for (std::size_t i = 1; i < 3; ++i) {
        std::int64_t expect = first;
        while (expect <= last) {
            auto p = c[i]->next_push(30s);
            if (!p) return {false, "gw" + std::to_string(i + 1) + " watcher: no push for seq " + std::to_string(expect)};
            if (test::str(*p, "t") != "event") continue;
            auto seq = p->at("ev").as_object().at("seq").as_int64();
            if (seq != expect)
                return {false, "gw" + std::to_string(i + 1) + " watcher got seq " + std::to_string(seq) + ", expected " +
                                   std::to_string(expect)};
            ++expect;
        }
    }
    figures << n << " pipelined sends on gw1 pushed in order to gw2 and gw3; ";

    auto t0 = Clock::now();
    figures << cut(db) << "; ";
    for (std::size_t i = 1; i < 3; ++i) {
        auto r = c[i]->wait_push([](const test::json::object& o) { return test::str(o, "t") == "resync"; }, 60s);
        if (!r) return {false, figures.str() + "gw" + std::to_string(i + 1) + " watcher got no resync"};
    }
    figures << "resync on gw2 and gw3 after " << ms_since(t0) << " ms; ";
    // Every gateway back on the bus and the database, and the watchers'
    // frames from the cut read, so that no resync of the cut itself can
    // pass for the delivery below.
    wait_until(
        [&] {
            for (std::size_t i = 0; i < 3; ++i)
                if (fleet.gateway(i).http("GET", "/readyz").first != 200) return false;
            return true;
        },
        60s, "/readyz 200 on every gateway after the cut");
    std::vector<long long> resyncs_before(3), reconnects_before(3);
    for (std::size_t i = 1; i < 3; ++i) {
        while (c[i]->next_push(0ms)) {
        }
        resyncs_before[i] = fleet.gateway(i).metric("im_pushes_total{t=\"resync\"}");
        reconnects_before[i] = fleet.gateway(i).metric("im_listen_reconnects_total");
    }
    // The sender's own gateway may still be reconnecting to the bus: it
    // answers UNAVAILABLE meanwhile, and the client resends the same key.
    test::json::object after;
    auto until = Clock::now() + 30s;
    do {
        after = c[0]->request({{"t", "send"}, {"conv", w.conv}, {"cmid", "after"}, {"body", "after"}}, 10s);
        if (test::str(after, "code") != "UNAVAILABLE") break;
        std::this_thread::sleep_for(200ms);
    } while (Clock::now() < until);
    if (test::str(after, "t") != "sent") return {false, figures.str() + "send after the cut: " + test::json::serialize(after)};
    const auto seq = test::num(after, "seq");
    int as_resync = 0;
    for (std::size_t i = 1; i < 3; ++i) {
        const std::string gw = "gw" + std::to_string(i + 1);
        // The event pushed, or, if the gateway's read of the new events
        // failed (a database connection timing out under load), a resync
        // (contract: the subscriber catches up by sync). Only a resync that
        // gateway pushed after the send, not for a bus reconnection, and a
        // sync that then holds the event, count as delivered.
        auto p = c[i]->wait_push(
            [&](const test::json::object& o) {
                return (test::str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == seq) ||
                       test::str(o, "t") == "resync";
            },
            30s);
        if (!p) return {false, figures.str() + gw + " watcher: no push after the cut"};
        if (test::str(*p, "t") == "event") continue;
        auto& g = fleet.gateway(i);
        if (g.metric("im_pushes_total{t=\"resync\"}") <= resyncs_before[i] ||
            g.metric("im_listen_reconnects_total") != reconnects_before[i])
            return {false, figures.str() + gw + " watcher got a resync instead of the push after the cut, "
                                               "not one for a failed read (bus reconnections " +
                               std::to_string(reconnects_before[i]) + " -> " +
                               std::to_string(g.metric("im_listen_reconnects_total")) + ")"};
        if (auto page = sync_lacks(*c[i], w.conv, seq); !page.empty())
            return {false, figures.str() + gw + " told its watcher to resync, but a sync after it lacks seq " +
                               std::to_string(seq) + ": " + page};
        ++as_resync;
    }
    if (as_resync > 0)
        figures << as_resync << " watcher(s) reached by a resync after a failed read, the sync holds the event; ";
    figures << "pushes flow again";
    return {true, figures.str()};
}

std::string cut_pg_listeners(const std::string& db) {
    pqxx::connection c(db);
    pqxx::nontransaction tx(c);
    auto n = tx.exec("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                     "WHERE application_name LIKE 'imserver-listen-%'")[0][0]
                 .as<int>();
    return "terminated " + std::to_string(n) + " LISTEN sessions";
}

Outcome admin_on_nats(NatsServer& nats, const std::string& db) {
    const std::vector<std::string> flags = gateway_flags({"--bus", nats.cluster_url()});
    test::ServerProcess gw1(db, flags, "gw-1"), gw2(db, flags, "gw-2");
    auto w = test::make_world(db, "adminnats", 2);
    auto newcomer = test::make_user(db, test::unique_name("adminnats-new"));
    auto late = test::make_user(db, test::unique_name("adminnats-late")); // revoked while the bus is down
    auto admin = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {"--bus", nats.cluster_url()});
        return test::admin(db, args);
    };
    std::ostringstream figures;
    auto ready = [](test::ServerProcess& g) { return g.http("GET", "/readyz").first; };
    // Both gateways on the bus first: a gateway whose first connect to NATS
    // timed out (a loaded machine) subscribes later and then tells its
    // subscribers to resync, which would pass for the delivery below.
    wait_until([&] { return ready(gw1) == 200 && ready(gw2) == 200; }, 60s, "/readyz 200 on both gateways");
    auto watcher = test::login(gw2.port(), w.users[1]);
    if (test::str(watcher->request({{"t", "sub"}}), "t") != "subscribed") return {false, "sub refused"};

    auto [rc, out] = admin({"member", "add", w.conv, newcomer.user});
    if (rc != 0) return {false, "admin member add exited " + std::to_string(rc) + ": " + out};
    const std::int64_t join_seq = std::stoll(out);
    // The notification reached gw2 when it pushes the join, or, if its
    // read of the new events failed (a connect to PostgreSQL timing out
    // under load), when it tells its subscribers to resync (contract: they
    // catch up by sync); the sync must then hold the join.
    auto joined = watcher->wait_push(
        [&](const test::json::object& o) {
            return (test::str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == join_seq) ||
                   test::str(o, "t") == "resync";
        },
        20s);
    if (!joined) return {false, "the join made by admin (seq " + std::to_string(join_seq) + ") was not pushed on gw2"};
    if (test::str(*joined, "t") == "resync") {
        if (auto page = sync_lacks(*watcher, w.conv, join_seq); !page.empty())
            return {false, "gw2 told its subscribers to resync, but a sync after it lacks the join (seq " +
                               std::to_string(join_seq) + "): " + page};
        figures << "admin's join reached gw2 as a resync (its read failed), the sync holds it; ";
    } else {
        figures << "admin's join pushed on gw2; ";
    }

    std::tie(rc, out) = admin({"epoch", "bump", w.conv});
    if (rc != 0) return {false, "admin epoch bump exited " + std::to_string(rc) + ": " + out};
    const std::int64_t epoch = std::stoll(out);
    auto hinted = watcher->wait_push(
        [&](const test::json::object& o) { return test::str(o, "t") == "hint" && test::num(o, "epoch") == epoch; }, 20s);
    if (!hinted) return {false, figures.str() + "no hint with the new epoch " + std::to_string(epoch) + " on gw2"};
    figures << "epoch bump hinted; ";

    const auto& dev = w.users[0];
    auto on1 = test::login(gw1.port(), dev);
    auto on2 = test::login(gw2.port(), dev);
    auto t0 = Clock::now();
    std::tie(rc, out) = admin({"device", "revoke", dev.device});
    if (rc != 0) return {false, figures.str() + "admin device revoke exited " + std::to_string(rc) + ": " + out};
    int c1 = on1->wait_closed(20s), c2 = on2->wait_closed(20s);
    if (c1 != 1008 || c2 != 1008)
        return {false, figures.str() + "revoked device's connections closed with " + std::to_string(c1) + " / " +
                           std::to_string(c2) + " (expected 1008 on both gateways)"};
    figures << "revocation closed both connections after " << ms_since(t0) << " ms; ";

    // The bus goes away: /readyz says so; a revocation committed meanwhile
    // (admin cannot publish it: exit 1) still closes the connections once
    // the bus is back, through the gateways' check after resync.
    auto late1 = test::login(gw1.port(), late);
    auto late2 = test::login(gw2.port(), late);
    if (ready(gw1) != 200 || ready(gw2) != 200) return {false, figures.str() + "/readyz not 200 with NATS up"};
    nats.stop();
    wait_until([&] { return ready(gw1) == 503 && ready(gw2) == 503; }, 30s, "/readyz 503 with NATS down");
    figures << "/readyz 503 while NATS is down; ";
    std::tie(rc, out) = admin({"device", "revoke", late.device});
    if (rc != 1) return {false, figures.str() + "admin revoke with NATS down exited " + std::to_string(rc)};
    // A send while the bus is down commits but cannot be published: the
    // sender must hear UNAVAILABLE (and resend the same key later).
    const test::json::object down_send = {{"t", "send"}, {"conv", w.conv}, {"cmid", "while-nats-down"}, {"body", "d"}};
    auto refused = watcher->request(down_send, 10s);
    if (test::str(refused, "code") != "UNAVAILABLE")
        return {false, figures.str() + "send with NATS down answered " + test::json::serialize(refused) +
                           " (expected UNAVAILABLE)"};
    figures << "send with NATS down answered UNAVAILABLE; ";
    if (late1->closed() || late2->closed()) return {false, figures.str() + "closed before the bus came back"};
    t0 = Clock::now();
    nats.start();
    c1 = late1->wait_closed(30s);
    c2 = late2->wait_closed(30s);
    if (c1 != 1008 || c2 != 1008)
        return {false, figures.str() + "revocation made while NATS was down: connections closed with " +
                           std::to_string(c1) + " / " + std::to_string(c2) + " after the bus came back (expected 1008)"};
    figures << "revocation made while NATS was down closed both connections " << ms_since(t0)
            << " ms after NATS started; ";
    wait_until([&] { return ready(gw1) == 200 && ready(gw2) == 200; }, 30s, "/readyz 200 with NATS back");
    figures << "/readyz 200 again; ";
    // The resend of the refused key, once the bus is back: one row, and the
    // reply names it.
    auto resent = watcher->request(down_send, 10s);
    if (test::str(resent, "t") != "sent")
        return {false, figures.str() + "resend with NATS back answered " + test::json::serialize(resent)};
    pqxx::connection pc(db);
    pqxx::nontransaction tx(pc);
    auto rows = tx.exec_params("SELECT count(*), min(seq) FROM events WHERE conv_id = $1 AND client_msg_id = $2",
                               w.conv, "while-nats-down")[0];
    if (rows[0].as<long>() != 1 || rows[1].as<std::int64_t>() != test::num(resent, "seq"))
        return {false, figures.str() + "the key sent while NATS was down has " + rows[0].c_str() +
                           " rows (expected 1, at the resend's seq " + std::to_string(test::num(resent, "seq")) + ")"};
    figures << "its resend after: one row, seq " << test::num(resent, "seq");
    return {true, figures.str()};
}

Outcome patroni_failover(const LabEnv& env) {
    PatroniCluster ha(env.config_dir);
    const std::string db = ha.url();
    Fleet fleet(env, db, gateway_flags());
    Clients clients(env, fleet.ws_url(), make_worlds(db, "ha"), 40);
    clients.wait_each_acked(5, 120s);

    // A probe user in its own conversation measures when writes go through
    // the whole stack (HAProxy -> gateway -> new primary) again.
    auto probe_world = test::make_world(db, "probe", 1);
    auto write_ok = [&](const std::string& cmid) {
        try {
            auto c = test::login(fleet.front_port(), probe_world.users[0]);
            auto r = c->request({{"t", "send"}, {"conv", probe_world.conv}, {"cmid", cmid}, {"body", cmid}}, 2s);
            return test::str(r, "t") == "sent";
        } catch (const std::exception&) {
            return false;
        }
    };
    if (!write_ok("probe-before")) return {false, "the probe could not send before the failover"};

    std::ostringstream figures;
    int probes = 0;
    const int n = rounds();
    for (int round = 1; round <= n; ++round) {
        auto old_primary = ha.primary();
        if (!old_primary) return {false, figures.str() + "no primary before failover " + std::to_string(round)};
        auto acked_at_kill = clients.total_acked();
        auto t0 = Clock::now();
        ha.kill_node(*old_primary);
        try {
            wait_until([&] { auto p = ha.primary(); return p && *p != *old_primary; }, 120s,
                       "Patroni to promote the standby");
        } catch (const std::exception& e) {
            return {false, figures.str() + e.what() + "\n" + ha.log_tail(1 - *old_primary)};
        }
        long promoted_ms = ms_since(t0);
        wait_until([&] { return write_ok("probe-" + std::to_string(++probes)); }, 120s, "a write through HAProxy");
        long writes_ms = ms_since(t0);
        wait_until([&] { return clients.total_acked() >= acked_at_kill + 40; }, 120s, "the clients' sends to resume");
        long clients_ms = ms_since(t0);
        figures << (n == 1 ? "" : "failover " + std::to_string(round) + ": ")
                << "primary SIGKILLed; standby promoted after " << promoted_ms << " ms, writes through HAProxy after "
                << writes_ms << " ms, clients' sends flowing after " << clients_ms << " ms; ";
        if (round == n) break;
        // The killed node comes back as the standby for the next failover.
        t0 = Clock::now();
        ha.restart_node(*old_primary);
        try {
            wait_until([&] { return ha.has_sync_standby() && ha.is_sync_standby(*old_primary); }, 180s,
                       "the old primary to rejoin as synchronous standby");
        } catch (const std::exception& e) {
            return {false, figures.str() + e.what() + "\n" + ha.log_tail(*old_primary)};
        }
        figures << "old primary back as synchronous standby after " << ms_since(t0) << " ms; ";
    }
    // What the senders saw while no primary answered: their gateway's
    // database session broke or could not be opened, which answers
    // UNAVAILABLE, and the SDK resent the same key (docs/scaling.md).
    return judge(db, clients, figures, [](Verdict& v) {
        if (!v.retries.count("UNAVAILABLE"))
            v.problems.push_back("no client saw UNAVAILABLE (and resent) during the failover");
    });
}

// 14-webhook-at-least-once across a database failover (issue 52's "Done
// when"; the acceptance lab's check, tests/acceptance/checks_webhooks.cpp,
// runs it on one PostgreSQL). Two gateways with webhook workers on the
// Patroni cluster's read-write URL, two conversations, one webhook to a real
// receiver (tests/support/webhook_receiver.hpp: its own HMAC check):
//   1. it answers 500 for a while (a round of sends after each attempt),
//   2. it refuses connections (3 rounds),
//   3. it is back but holds the next delivery: the gateway holding that
//      delivery's lease is SIGKILLed and, at the same moment, the Patroni
//      primary's node (the standby is promoted),
//   4. rounds through the survivor once writes go through again, then the
//      receiver answers 200.
// Judged against the events table read after (on the new primary): every
// committed event since the registration arrived, the first arrival of each
// in seq order per conversation, no bad signature, and every delivery is a
// committed event with that event's mid (a delivery of an event the failover
// lost would show as a missing id or as another mid at its seq).
// `broken`: the gateways' rule.webhook_retry=skip (the negative control).
// `ha`: the cluster whose primary fails over with the gateway (null: the
// gateway alone, on `db`).
Outcome webhook_failover(PatroniCluster* ha, const std::string& db, bool broken) {
    const std::string secret = "scaleout-webhook-secret-0123456789";
    // SQL on whichever node is primary now, retried while there is none.
    auto rows = [&](const std::string& query) {
        std::optional<pqxx::result> out;
        wait_until(
            [&] {
                try {
                    pqxx::connection c(db);
                    pqxx::nontransaction tx(c);
                    out = tx.exec(query);
                    return true;
                } catch (const std::exception&) {
                    return false;
                }
            },
            120s, "the database to answer: " + query);
        return *out;
    };
    auto value = [&](const std::string& query) {
        auto r = rows(query);
        return r.empty() || r[0][0].is_null() ? std::string() : std::string(r[0][0].c_str());
    };
    auto w1 = test::make_world(db, "whfo1", 2), w2 = test::make_world(db, "whfo2", 2);
    const std::string c1 = w1.conv, c2 = w2.conv;
    const std::string h1 = value("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + test::q(c1));
    const std::string h2 = value("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + test::q(c2));

    test::WebhookReceiver rx(secret);
    const std::vector<std::string> flags =
        gateway_flags({"--enable-faults", "--webhook-lease-ms", "2000", "--webhook-timeout-ms", "120000",
                       "--webhook-retry-max-ms", "1000", "--webhook-poll-ms", "20", "--webhook-refresh-ms", "200"});
    const std::string name1 = test::unique_name("gw-whfo1"), name2 = test::unique_name("gw-whfo2");
    std::vector<std::unique_ptr<test::ServerProcess>> gw;
    gw.push_back(std::make_unique<test::ServerProcess>(db, flags, name1));
    gw.push_back(std::make_unique<test::ServerProcess>(db, flags, name2));
    if (broken)
        for (auto& g : gw) {
            auto [status, body] = g->http("POST", "/lab/fault", "rule.webhook_retry=skip");
            if (status != 200) return {false, "POST /lab/fault -> " + std::to_string(status) + " " + body};
        }
    const std::string hook = test::admin_ok(db, {"webhook", "add", rx.url(), "--secret", secret});

    // Senders that outlive their gateway and the database's failover: the
    // same key again (a new connection if needed, to the given gateway)
    // until it is answered `sent`.
    struct Sender {
        test::TestUser user;
        std::string conv;
        std::unique_ptr<test::WsClient> ws;
    };
    Sender a{w1.users[0], c1, nullptr}, b{w2.users[0], c2, nullptr};
    int n = 0;
    long unavailable = 0;
    auto send = [&](Sender& s, test::ServerProcess& g, const std::string& body) {
        const std::string cmid = test::uuid4();
        wait_until(
            [&] {
                try {
                    if (!s.ws || s.ws->closed()) s.ws = test::login(g.port(), s.user);
                    auto r = s.ws->request({{"t", "send"}, {"conv", s.conv}, {"cmid", cmid}, {"body", body}}, 5s);
                    if (test::str(r, "t") == "sent") return true;
                    if (test::str(r, "code") == "UNAVAILABLE") ++unavailable;
                    if (test::str(r, "t") == "timeout") s.ws.reset();
                } catch (const std::exception&) {
                    s.ws.reset();
                }
                std::this_thread::sleep_for(200ms);
                return false;
            },
            180s, "a send of " + s.user.user + " to be answered sent");
    };
    auto round = [&](test::ServerProcess& ga, test::ServerProcess& gb) {
        ++n;
        send(a, ga, "one " + std::to_string(n));
        send(b, gb, "two " + std::to_string(n));
    };
    auto metric_sum = [&](const std::string& name) {
        long long sum = 0;
        for (auto& g : gw)
            if (g) sum += std::max(0LL, g->metric(name));
        return sum;
    };
    std::ostringstream figures;

    // 1. 500 for a while: a round of sends after each refused delivery.
    rx.set_mode(test::WebhookReceiver::Mode::fail);
    const auto fail_until = Clock::now() + 8s;
    while (Clock::now() < fail_until) {
        const int seen = rx.requests();
        round(*gw[0], *gw[1]);
        wait_until([&] { return rx.requests() > seen; }, 15s, "a delivery attempt while the receiver answers 500");
    }
    figures << rx.requests() << " requests answered 500; ";
    // 2. Down: connections refused.
    rx.down();
    const long long refused_before = metric_sum("im_webhook_deliveries_total{outcome=\"network_error\"}");
    const auto refused = [&] {
        return metric_sum("im_webhook_deliveries_total{outcome=\"network_error\"}") - refused_before;
    };
    // Three rounds, and another after each 3 s without a new refusal (the
    // deliverer batches what waits: the control, which moves a cursor past
    // a refused batch, may otherwise find nothing left to attempt).
    for (int i = 0; i < 3; ++i) round(*gw[0], *gw[1]);
    const auto down_until = Clock::now() + 20s;
    while (refused() < 2 && Clock::now() < down_until) {
        const long long seen = refused();
        const auto quiet_until = Clock::now() + 3s;
        while (refused() == seen && Clock::now() < quiet_until) std::this_thread::sleep_for(100ms);
        if (refused() == seen) round(*gw[0], *gw[1]);
    }
    wait_until([&] { return refused() >= 2; }, 1s, "refused deliveries while the receiver is down");
    figures << metric_sum("im_webhook_deliveries_total{outcome=\"network_error\"}") << " refused; ";
    // 3. Back, holding the next delivery: its gateway and the primary die.
    rx.set_mode(test::WebhookReceiver::Mode::hold);
    rx.up();
    round(*gw[0], *gw[1]);
    wait_until([&] { return rx.held() >= 1; }, 30s, "a delivery to reach the receiver again");
    const std::string owner = value("SELECT lease_owner FROM webhook_cursors WHERE webhook_id = " + test::q(hook) +
                                    " AND lease_until > now() ORDER BY lease_until DESC LIMIT 1");
    std::size_t dying;
    if (owner.rfind(name1 + "/", 0) == 0) dying = 0;
    else if (owner.rfind(name2 + "/", 0) == 0) dying = 1;
    else return {false, figures.str() + "the held delivery's lease names no gateway of the scenario: '" + owner + "'"};
    std::optional<std::size_t> old_primary;
    if (ha) {
        old_primary = ha->primary();
        if (!old_primary) return {false, figures.str() + "no primary before the failover"};
    }
    auto t0 = Clock::now();
    gw[dying]->kill(); // SIGKILL mid-delivery: its lease is never released
    if (ha) ha->kill_node(*old_primary);
    gw[dying].reset();
    test::ServerProcess& survivor = *gw[1 - dying];
    a.ws.reset();
    b.ws.reset();
    figures << "the delivering gateway (" << owner << ")" << (ha ? " and the primary" : "")
            << " SIGKILLed mid-delivery; ";
    if (ha) {
        try {
            wait_until([&] { auto p = ha->primary(); return p && *p != *old_primary; }, 120s,
                       "Patroni to promote the standby");
        } catch (const std::exception& e) {
            return {false, figures.str() + e.what() + "\n" + ha->log_tail(1 - *old_primary)};
        }
        figures << "standby promoted after " << ms_since(t0) << " ms, ";
    }
    round(survivor, survivor); // through UNAVAILABLE until the survivor writes (to the new primary)
    figures << "sends through the survivor after " << ms_since(t0) << " ms (" << unavailable
            << " UNAVAILABLE answers resent); ";
    rx.set_mode(test::WebhookReceiver::Mode::ok);
    for (int i = 0; i < 3; ++i) round(survivor, survivor);

    // 4. Drained: both cursors at their conversation's head.
    const bool drained = wait_until(
        [&] {
            return value("SELECT count(*) FROM webhook_cursors wc JOIN conversations c USING (conv_id) WHERE "
                         "wc.webhook_id = " + test::q(hook) + " AND wc.conv_id IN (" + test::q(c1) + ", " +
                         test::q(c2) + ") AND wc.done_seq = c.next_seq - 1") == "2";
        },
        90s);
    figures << "drained " << ms_since(t0) << " ms after the kill; ";
    std::vector<std::string> problems;
    if (!drained) problems.push_back("drained: the cursors did not reach the heads within 90 s");
    std::map<std::string, std::string> committed; // id -> mid
    for (const auto& row : rows("SELECT conv_id || ':' || seq, mid::text FROM events WHERE (conv_id = " + test::q(c1) +
                                " AND seq > " + h1 + ") OR (conv_id = " + test::q(c2) + " AND seq > " + h2 + ")"))
        committed[row[0].c_str()] = row[1].c_str();
    const auto accepted = rx.accepted();
    std::set<std::string> got;
    std::size_t stray = 0;
    for (const auto& x : accepted) {
        got.insert(x.id);
        auto it = committed.find(x.id);
        const std::string mid = x.ev.if_contains("mid") && x.ev.at("mid").is_string()
                                    ? std::string(x.ev.at("mid").as_string()) : std::string();
        if (it == committed.end() || it->second != mid) {
            if (stray++ == 0)
                problems.push_back("only-committed: " + x.id + " (mid " + mid + ") was delivered but the events table " +
                                   (it == committed.end() ? "has no such event" : "has mid " + it->second));
        }
    }
    std::size_t missing = 0;
    std::string first_missing;
    for (const auto& [id, mid] : committed)
        if (!got.count(id) && missing++ == 0) first_missing = id;
    if (missing)
        problems.push_back("every-event-delivered: " + std::to_string(missing) + " of " +
                           std::to_string(committed.size()) + " committed events never arrived (first: " +
                           first_missing + ")");
    if (const std::string order = rx.order_violation(); !order.empty()) problems.push_back("seq-order: " + order);
    if (rx.bad_signatures()) problems.push_back("signatures-valid: " + std::to_string(rx.bad_signatures()) + " bad");
    test::admin(db, {"webhook", "remove", hook});
    figures << committed.size() << " events in 2 conversations, " << accepted.size() - got.size()
            << " duplicates (deduped by id)";
    if (problems.empty()) return {true, figures.str()};
    std::string detail = figures.str();
    for (const auto& p : problems) detail += "; " + p;
    return {false, detail};
}

// The negative control: the check must fail when a failed delivery moves
// the cursor on (at most once instead of at least once). It runs without
// the database failover (on the lab's single PostgreSQL, a minute less in
// the plain stage): what it proves is that the judging above can fail.
Outcome webhook_failover_control(const std::string& db) {
    Outcome o = webhook_failover(nullptr, db, true);
    if (o.pass) return {false, "the check passed with rule.webhook_retry=skip: " + o.detail};
    if (o.detail.find("every-event-delivered") == std::string::npos)
        return {false, "with rule.webhook_retry=skip the check failed, but not for undelivered events: " + o.detail};
    return {true, "caught: " + o.detail};
}

} // namespace

int main(int argc, char** argv) {
    LabEnv env;
    const char* cfg = std::getenv("IM_SCALEOUT_CONFIG_DIR");
    const char* client = std::getenv("IM_SCALEOUT_CLIENT_BIN");
    if (!cfg || !client || !std::getenv("IMSERVER_BIN")) {
        std::fprintf(stderr, "im_scaleout needs IMSERVER_BIN, IM_SCALEOUT_CLIENT_BIN and IM_SCALEOUT_CONFIG_DIR\n");
        return 2;
    }
    env.config_dir = cfg;
    env.client_bin = client;

    std::unique_ptr<test::TestPostgres> pg; // shared by the scenarios on one PostgreSQL
    auto single_pg = [&] {
        if (!pg) pg = std::make_unique<test::TestPostgres>();
        return pg->url();
    };
    std::unique_ptr<NatsServer> nats; // shared by the scenarios on the NATS bus
    auto nats_bus = [&]() -> std::vector<std::string> {
        if (!nats) nats = std::make_unique<NatsServer>(env.config_dir);
        return {"--bus", nats->cluster_url()};
    };
    auto restart_nats = [&](const std::string&) {
        nats->restart();
        return std::string("nats-server SIGKILLed and started again");
    };
    std::vector<std::pair<std::string, std::function<Outcome()>>> scenarios = {
        {"bus-postgres", [&] { return bus_checks(env, "buspg", {}, single_pg, cut_pg_listeners); }},
        {"bus-nats", [&] { return bus_checks(env, "busnats", nats_bus(), single_pg, restart_nats); }},
        {"rolling-restart", [&] { return rolling_restart(env, "roll", {}, single_pg); }},
        {"rolling-restart-nats", [&] { return rolling_restart(env, "rollnats", nats_bus(), single_pg); }},
        {"admin-nats", [&] { nats_bus(); return admin_on_nats(*nats, single_pg()); }},
        {"patroni-failover", [&] { return patroni_failover(env); }},
        {"webhook-failover", [&] { PatroniCluster ha(env.config_dir); return webhook_failover(&ha, ha.url(), false); }},
        {"webhook-failover-control", [&] { return webhook_failover_control(single_pg()); }},
    };
    std::vector<std::string> wanted(argv + 1, argv + argc);
    int failed = 0, passed = 0;
    for (auto& [name, run] : scenarios) {
        if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
        auto t0 = Clock::now();
        Outcome o;
        try {
            o = run();
        } catch (const std::exception& e) {
            o = {false, e.what()};
        }
        std::printf("%s %s (%s; %ld ms)\n", o.pass ? "PASS" : "FAIL", name.c_str(), o.detail.c_str(), ms_since(t0));
        std::fflush(stdout);
        (o.pass ? passed : failed)++;
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
