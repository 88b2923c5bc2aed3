// The scale-out lab (docs/scaling.md): real HAProxy, real gateways, real SDK
// clients, PostgreSQL under Patroni with etcd. Each scenario prints
//   PASS <name> (<figures>)   or   FAIL <name> (<what went wrong>)
// and the lab exits non-zero when any scenario failed.
//
//   im_scaleout [SCENARIO...]     default: all of them
//
// Scenarios:
//   bus-postgres      pushes across gateways in seq order; LISTEN sessions
//                     terminated -> every subscriber gets resync
//   bus-nats          the same with --bus nats://...; nats-server killed and
//                     started again -> every subscriber gets resync
//   rolling-restart   3 gateways behind HAProxy, SIGTERM + restart each in
//                     turn under send traffic from SDK clients
//   rolling-restart-nats  the same with the NATS bus
//   admin-nats        the admin CLI with --bus nats://...: joins, epoch bumps
//                     and revocations reach gateways that listen only to
//                     NATS; /readyz follows the NATS connection; a revocation
//                     committed while NATS is down closes the device's
//                     connections once the bus is back
//   patroni-failover  the same fleet on a Patroni primary + synchronous
//                     standby; SIGKILL the primary's node under traffic
#include "fleet.hpp"
#include "natsserver.hpp"
#include "patroni.hpp"

#include <algorithm>
#include <cstdio>
#include <pqxx/pqxx>
#include <cstdlib>
#include <functional>
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

Outcome judge(const std::string& db, Clients& clients, std::ostringstream& figures) {
    clients.stop_and_converge(180s);
    auto v = verify(db, clients);
    figures << v.summary();
    if (v.ok()) return {true, figures.str()};
    std::string detail = figures.str();
    for (std::size_t i = 0; i < v.problems.size() && i < 8; ++i) detail += "; " + v.problems[i];
    return {false, detail};
}

Outcome rolling_restart(const LabEnv& env, const std::string& label, const std::vector<std::string>& bus_flags,
                        const std::function<std::string()>& db_url) {
    std::string db = db_url();
    Fleet fleet(env, db, gateway_flags(bus_flags));
    Clients clients(env, fleet.ws_url(), make_worlds(db, label), 40);
    clients.wait_each_acked(5, 120s);
    std::ostringstream figures;
    for (std::size_t i = 0; i < fleet.size(); ++i) {
        auto t0 = Clock::now();
        int rc = fleet.gateway(i).terminate(30s);
        long drained_ms = ms_since(t0);
        if (rc != 0) return {false, "gw" + std::to_string(i + 1) + " exited " + std::to_string(rc) + " on SIGTERM"};
        fleet.gateway(i).restart();
        wait_until([&] { return fleet.status(i) == "UP"; }, 60s, "HAProxy to see the restarted gateway UP");
        long back_ms = ms_since(t0);
        // Traffic must flow again before the next gateway goes.
        auto before = clients.total_acked();
        wait_until([&] { return clients.total_acked() >= before + 20; }, 60s, "sends to be acknowledged again");
        figures << "gw" << i + 1 << " drained " << drained_ms << " ms, UP again " << back_ms << " ms; ";
    }
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

// The bus, seen from the clients: a sender on gw1, watchers on gw2 and gw3.
// Pushes cross gateways, arrive in seq order without gaps, and when the bus
// connection is cut and comes back every watcher gets `resync` and pushes
// flow again. `cut` breaks the bus of every gateway and returns what it did.
Outcome bus_checks(const LabEnv& env, const std::string& label, const std::vector<std::string>& bus_flags,
                   const std::function<std::string()>& db_url, const std::function<std::string(const std::string&)>& cut) {
    const std::string db = db_url();
    Fleet fleet(env, db, gateway_flags(bus_flags));
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
    for (std::size_t i = 1; i < 3; ++i) {
        auto seq = test::num(after, "seq");
        auto p = c[i]->wait_push(
            [&](const test::json::object& o) {
                return test::str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == seq;
            },
            30s);
        if (!p) return {false, figures.str() + "gw" + std::to_string(i + 1) + " watcher: no push after the cut"};
    }
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
    const std::vector<std::string> flags = gateway_flags({"--bus", nats.url()});
    test::ServerProcess gw1(db, flags, "gw-1"), gw2(db, flags, "gw-2");
    auto w = test::make_world(db, "adminnats", 2);
    auto newcomer = test::make_user(db, test::unique_name("adminnats-new"));
    auto late = test::make_user(db, test::unique_name("adminnats-late")); // revoked while the bus is down
    auto admin = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {"--bus", nats.url()});
        return test::admin(db, args);
    };
    auto login = [](unsigned short port, const test::TestUser& u) {
        auto c = std::make_unique<test::WsClient>(port);
        if (test::str(c->hello(u.token), "t") != "welcome") throw std::runtime_error("hello refused for " + u.user);
        return c;
    };
    std::ostringstream figures;
    auto watcher = login(gw2.port(), w.users[1]);
    if (test::str(watcher->request({{"t", "sub"}}), "t") != "subscribed") return {false, "sub refused"};

    auto [rc, out] = admin({"member", "add", w.conv, newcomer.user});
    if (rc != 0) return {false, "admin member add exited " + std::to_string(rc) + ": " + out};
    const std::int64_t join_seq = std::stoll(out);
    auto joined = watcher->wait_push(
        [&](const test::json::object& o) {
            return test::str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == join_seq;
        },
        20s);
    if (!joined) return {false, "the join made by admin (seq " + std::to_string(join_seq) + ") was not pushed on gw2"};
    figures << "admin's join pushed on gw2; ";

    std::tie(rc, out) = admin({"epoch", "bump", w.conv});
    if (rc != 0) return {false, "admin epoch bump exited " + std::to_string(rc) + ": " + out};
    const std::int64_t epoch = std::stoll(out);
    auto hinted = watcher->wait_push(
        [&](const test::json::object& o) { return test::str(o, "t") == "hint" && test::num(o, "epoch") == epoch; }, 20s);
    if (!hinted) return {false, figures.str() + "no hint with the new epoch " + std::to_string(epoch) + " on gw2"};
    figures << "epoch bump hinted; ";

    const auto& dev = w.users[0];
    auto on1 = login(gw1.port(), dev);
    auto on2 = login(gw2.port(), dev);
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
    auto late1 = login(gw1.port(), late);
    auto late2 = login(gw2.port(), late);
    auto ready = [](test::ServerProcess& g) { return g.http("GET", "/readyz").first; };
    if (ready(gw1) != 200 || ready(gw2) != 200) return {false, figures.str() + "/readyz not 200 with NATS up"};
    nats.stop();
    wait_until([&] { return ready(gw1) == 503 && ready(gw2) == 503; }, 30s, "/readyz 503 with NATS down");
    figures << "/readyz 503 while NATS is down; ";
    std::tie(rc, out) = admin({"device", "revoke", late.device});
    if (rc != 1) return {false, figures.str() + "admin revoke with NATS down exited " + std::to_string(rc)};
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
    figures << "/readyz 200 again";
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
            test::WsClient c(fleet.front_port());
            if (test::str(c.hello(probe_world.users[0].token), "t") != "welcome") return false;
            auto r = c.request({{"t", "send"}, {"conv", probe_world.conv}, {"cmid", cmid}, {"body", cmid}}, 2s);
            return test::str(r, "t") == "sent";
        } catch (const std::exception&) {
            return false;
        }
    };
    if (!write_ok("probe-before")) return {false, "the probe could not send before the failover"};

    auto old_primary = ha.primary();
    if (!old_primary) return {false, "no primary before the failover"};
    auto acked_at_kill = clients.total_acked();
    auto t0 = Clock::now();
    ha.kill_node(*old_primary);
    wait_until([&] { auto p = ha.primary(); return p && *p != *old_primary; }, 120s, "Patroni to promote the standby");
    long promoted_ms = ms_since(t0);
    int probes = 0;
    wait_until([&] { return write_ok("probe-" + std::to_string(++probes)); }, 120s, "a write through HAProxy");
    long writes_ms = ms_since(t0);
    wait_until([&] { return clients.total_acked() >= acked_at_kill + 40; }, 120s, "the clients' sends to resume");
    long clients_ms = ms_since(t0);

    std::ostringstream figures;
    figures << "primary SIGKILLed; standby promoted after " << promoted_ms << " ms, writes through HAProxy after "
            << writes_ms << " ms, clients' sends flowing after " << clients_ms << " ms; ";
    return judge(db, clients, figures);
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
        return {"--bus", nats->url()};
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
