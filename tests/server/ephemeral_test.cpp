// Contract section 13: typing and presence, against real gateways (two on
// one PostgreSQL, and two on NATS), real WebSocket connections and a real
// SIGKILL. Neither is stored in the log; both ride the notification bus.
//
// "Not pushed" is shown by order, never by a quiet wait: a later frame that
// would have come after the one that must not come (the same publisher, the
// same notifier thread, the same connection) arrives first.
#include "common.hpp"

#include "store/store.hpp"

#include <pqxx/pqxx>

#include <atomic>
#include <csignal>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

using namespace im::test;

namespace {

// A short lease so that a killed gateway's users go offline in seconds
// (the default, 30 s, puts them offline within 40 s: docs/scaling.md).
const std::vector<std::string> gateway_flags = {"--quiet", "--presence-lease-ms", "1500"};

json::object typing(WsClient& c, const std::string& conv, bool on) {
    return c.request({{"t", "typing"}, {"conv", conv}, {"on", on}});
}

json::object presence(WsClient& c, const std::vector<std::string>& users) {
    json::array a;
    for (const auto& u : users) a.emplace_back(u);
    return c.request({{"t", "presence"}, {"users", std::move(a)}});
}

bool is(const json::object& f, const char* t) { return f.contains("t") && str(f, "t") == t; }

/// The next typing push on `c` (other pushes skipped).
json::object next_typing(WsClient& c, std::chrono::milliseconds timeout = 20s) {
    auto f = c.wait_push([](const json::object& o) { return is(o, "typing"); }, timeout);
    if (!f) throw std::runtime_error("no typing push");
    return *f;
}

/// The next presence push on `c` (other pushes skipped).
json::object next_presence(WsClient& c, std::chrono::milliseconds timeout = 20s) {
    auto f = c.wait_push([](const json::object& o) { return is(o, "presence"); }, timeout);
    if (!f) throw std::runtime_error("no presence push");
    return *f;
}

std::unique_ptr<WsClient> subscribed(unsigned short port, const TestUser& u, const std::string& install = {}) {
    auto c = login(port, u, install);
    if (str(c->request({{"t", "sub"}}), "t") != "subscribed") throw std::runtime_error("sub refused");
    return c;
}

/// presence_users.online of a user as the database has it ("" when no row).
std::string online_in_db(const TestPostgres& pg, const std::string& user) {
    return pg.scalar("SELECT online FROM presence_users WHERE user_id = " + q(user));
}

class Ephemeral : public ::testing::Test {
protected:
    static inline TestPostgres* pg = nullptr;
    static inline ServerProcess* gw1 = nullptr;
    static inline ServerProcess* gw2 = nullptr;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        gw1 = new ServerProcess(pg->url(), gateway_flags, "gw-1");
        gw2 = new ServerProcess(pg->url(), gateway_flags, "gw-2");
    }
    static void TearDownTestSuite() {
        delete gw2;
        delete gw1;
        delete pg;
    }
    std::string db() const { return pg->url(); }
};

// ---------------------------------------------------------------- typing

TEST_F(Ephemeral, typing_reaches_the_other_members_on_both_gateways_never_the_sender_and_stores_nothing) {
    auto w = make_world(db(), "typ", 3);
    const auto &ana = w.users[0], &ben = w.users[1], &cyd = w.users[2];
    const std::string install = unique_name("inst");
    auto a = subscribed(gw1->port(), ana, install);
    auto a2 = subscribed(gw2->port(), ana, install); // the sender's second connection
    auto b = subscribed(gw2->port(), ben);  // across the bus
    auto c = subscribed(gw1->port(), cyd);  // the sender's own gateway
    const auto events_before = count_rows(*pg, "conv_id = " + q(w.conv));
    const auto head_before = pg->scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv));

    auto r = typing(*a, w.conv, true);
    EXPECT_EQ(str(r, "t"), "typing_ok") << json::serialize(r);
    EXPECT_EQ(r.size(), 2u) << "typing_ok carries nothing but its rid: " << json::serialize(r);
    for (WsClient* other : {b.get(), c.get()}) {
        auto f = next_typing(*other);
        EXPECT_EQ(str(f, "conv"), w.conv);
        EXPECT_EQ(str(f, "user"), ana.user);
        EXPECT_TRUE(f.at("on").as_bool());
        EXPECT_EQ(f.size(), 4u) << json::serialize(f);
    }
    // cyd types after ana, on the same gateway: any typing push of ana's to
    // ana's own connections would have come before cyd's.
    EXPECT_EQ(str(typing(*c, w.conv, true), "t"), "typing_ok");
    for (WsClient* self : {a.get(), a2.get()}) {
        auto f = next_typing(*self);
        EXPECT_EQ(str(f, "user"), cyd.user) << "the sender got its own typing";
    }
    EXPECT_EQ(str(typing(*a, w.conv, false), "t"), "typing_ok");
    EXPECT_EQ(str(next_typing(*b), "user"), cyd.user); // cyd's, before ana's stop
    auto off = next_typing(*b);
    EXPECT_EQ(str(off, "user"), ana.user);
    EXPECT_FALSE(off.at("on").as_bool());

    // Never stored: no event, the head did not move (nor did sync's page).
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv)), events_before);
    EXPECT_EQ(pg->scalar("SELECT next_seq FROM conversations WHERE conv_id = " + q(w.conv)), head_before);
    auto page = sync_conv(*b, w.conv, 0);
    EXPECT_EQ(num(page, "head"), std::stoll(head_before) - 1);
    for (const auto& ev : page.at("events").as_array()) EXPECT_NE(str(ev.as_object(), "kind"), "typing");
}

TEST_F(Ephemeral, typing_needs_an_open_period_and_a_well_formed_frame) {
    auto w = make_world(db(), "typm", 2);
    auto stranger = make_user(db(), unique_name("typm-x"));
    auto x = login(gw1->port(), stranger);
    EXPECT_EQ(str(typing(*x, w.conv, true), "code"), "NOT_MEMBER");
    EXPECT_EQ(str(typing(*x, unique_name("nosuch"), true), "code"), "NOT_MEMBER");
    // A former member: no open period.
    admin_ok(db(), {"member", "remove", w.conv, w.users[1].user});
    auto gone = login(gw1->port(), w.users[1]);
    EXPECT_EQ(str(typing(*gone, w.conv, true), "code"), "NOT_MEMBER");
    auto a = login(gw1->port(), w.users[0]);
    EXPECT_EQ(str(a->request({{"t", "typing"}, {"conv", w.conv}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "typing"}, {"conv", w.conv}, {"on", 1}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "typing"}, {"conv", "bad conv"}, {"on", true}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(typing(*a, w.conv, true), "t"), "typing_ok");
}

TEST_F(Ephemeral, typing_in_a_conversation_above_push_full_max_is_answered_and_pushed_to_nobody) {
    auto big = make_world(db(), "typbig", 3);
    admin_ok(db(), {"conv", "set", big.conv, "--push-full-max", "2"}); // 3 members: above it
    const auto &ana = big.users[0], &ben = big.users[1];
    const auto small = unique_name("typsmall");
    admin_ok(db(), {"conv", "create", small, "--kind", "group", "--members", ana.user + "," + ben.user});
    auto a = login(gw1->port(), ana);
    auto b = subscribed(gw2->port(), ben);
    EXPECT_EQ(str(typing(*a, big.conv, true), "t"), "typing_ok");
    // Then in a small conversation: ben's first typing push must be this one.
    EXPECT_EQ(str(typing(*a, small, true), "t"), "typing_ok");
    auto f = next_typing(*b);
    EXPECT_EQ(str(f, "conv"), small) << "typing pushed in a group above push_full_max";
}

TEST_F(Ephemeral, typing_is_forwarded_at_most_twice_a_second_per_device_and_conversation) {
    auto w = make_world(db(), "typrate", 3);
    const auto &ana = w.users[0], &ben = w.users[1], &cyd = w.users[2];
    auto a = login(gw1->port(), ana);
    auto c = login(gw1->port(), cyd);
    auto b = subscribed(gw2->port(), ben);
    constexpr int frames = 10;
    const auto t0 = Clock::now();
    for (int i = 0; i < frames; ++i) a->send_json({{"t", "typing"}, {"rid", "ty" + std::to_string(i)}, {"conv", w.conv}, {"on", i % 2 == 0}});
    for (int i = 0; i < frames; ++i) {
        auto reply = a->next(20s);
        ASSERT_TRUE(reply);
        EXPECT_EQ(str(*reply, "t"), "typing_ok") << "a dropped typing frame is still answered";
    }
    const auto elapsed_ms = ms_since(t0);
    // The marker: cyd's typing after every one of ana's was answered.
    EXPECT_EQ(str(typing(*c, w.conv, true), "t"), "typing_ok");
    int from_ana = 0;
    for (;;) {
        auto f = next_typing(*b);
        if (str(f, "user") == cyd.user) break;
        ++from_ana;
    }
    // At most 2 in any second: the frames took elapsed_ms to answer.
    const long long allowed = 2 * (elapsed_ms / 1000 + 1);
    std::printf("typing: %d frames in %lld ms, %d forwarded (allowed %lld)\n", frames, elapsed_ms, from_ana, allowed);
    EXPECT_GE(from_ana, 1);
    EXPECT_LE(from_ana, allowed);
}

// -------------------------------------------------------------- presence

TEST_F(Ephemeral, presence_answers_who_shares_or_shared_a_conversation_and_leaves_strangers_out) {
    auto w = make_world(db(), "pres", 3);
    const auto &ana = w.users[0], &ben = w.users[1], &cyd = w.users[2];
    admin_ok(db(), {"member", "remove", w.conv, cyd.user}); // cyd shared one: still answered
    auto stranger = make_user(db(), unique_name("pres-x"));
    auto never = make_user(db(), unique_name("pres-n")); // exists, shares nothing
    admin_ok(db(), {"conv", "create", unique_name("pres-n-c"), "--kind", "group", "--members",
                    ana.user + "," + never.user});
    auto x = login(gw2->port(), stranger); // online, but a stranger to ana
    auto b = login(gw2->port(), ben);
    wait_until([&] { return online_in_db(*pg, ben.user) == "t" && online_in_db(*pg, stranger.user) == "t"; }, 20s,
               "ben and the stranger online");
    auto a = login(gw1->port(), ana);
    const auto before = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
    auto r = presence(*a, {stranger.user, ben.user, cyd.user, never.user, "no-such-user", ben.user});
    ASSERT_EQ(str(r, "t"), "presence") << json::serialize(r);
    std::map<std::string, json::object> got;
    for (const auto& u : r.at("users").as_array()) got[str(u.as_object(), "user")] = u.as_object();
    EXPECT_EQ(got.size(), 3u) << json::serialize(r);
    EXPECT_FALSE(got.count(stranger.user)) << "a stranger's presence was revealed";
    EXPECT_FALSE(got.count("no-such-user"));
    ASSERT_TRUE(got.count(ben.user) && got.count(cyd.user) && got.count(never.user));
    EXPECT_TRUE(got[ben.user].at("online").as_bool());
    EXPECT_GE(num(got[ben.user], "last_seen"), before - 5000) << "online: last_seen is now";
    EXPECT_FALSE(got[cyd.user].at("online").as_bool());
    EXPECT_TRUE(got[cyd.user].at("last_seen").is_null()) << "never connected: null";
    // ben goes: offline, last seen when the connection closed.
    const auto close_at = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
    b.reset();
    wait_until([&] { return online_in_db(*pg, ben.user) == "f"; }, 20s, "ben offline");
    auto r2 = presence(*a, {ben.user});
    ASSERT_EQ(r2.at("users").as_array().size(), 1u);
    const auto& bo = r2.at("users").as_array()[0].as_object();
    EXPECT_FALSE(bo.at("online").as_bool());
    EXPECT_GE(num(bo, "last_seen"), close_at - 1000);
}

TEST_F(Ephemeral, presence_takes_1_to_500_user_ids) {
    auto u = make_user(db(), unique_name("presl"));
    auto a = login(gw1->port(), u);
    EXPECT_EQ(str(presence(*a, {}), "code"), "INVALID_ARGUMENT");
    std::vector<std::string> many;
    for (int i = 0; i < 501; ++i) many.push_back("u" + std::to_string(i));
    EXPECT_EQ(str(presence(*a, many), "code"), "INVALID_ARGUMENT");
    many.pop_back();
    EXPECT_EQ(str(presence(*a, many), "t"), "presence");
    EXPECT_EQ(str(a->request({{"t", "presence"}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "presence"}, {"users", "ana"}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "presence"}, {"users", json::array{1, 2}}}), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(a->request({{"t", "presence"}, {"users", json::array{"bad id"}}}), "code"), "INVALID_ARGUMENT");
}

TEST_F(Ephemeral, presence_changes_of_watched_users_are_pushed_across_gateways_and_the_watch_list_is_replaced) {
    auto w = make_world(db(), "presw", 3);
    const auto &ana = w.users[0], &ben = w.users[1], &cyd = w.users[2];
    auto a = login(gw1->port(), ana); // no sub needed: the watch list is the subscription
    ASSERT_EQ(str(presence(*a, {ben.user}), "t"), "presence");
    auto b = login(gw2->port(), ben);
    auto on = next_presence(*a);
    EXPECT_EQ(str(on, "user"), ben.user);
    EXPECT_TRUE(on.at("online").as_bool());
    EXPECT_GT(num(on, "last_seen"), 0) << "online: last_seen is now";
    EXPECT_EQ(on.size(), 4u) << json::serialize(on);
    b.reset();
    auto off = next_presence(*a);
    EXPECT_EQ(str(off, "user"), ben.user);
    EXPECT_FALSE(off.at("online").as_bool());
    EXPECT_GT(num(off, "last_seen"), 0);

    // Replaced: now cyd only. ben comes and goes (both on gw-2, in order),
    // then cyd: the first push must be cyd's.
    ASSERT_EQ(str(presence(*a, {cyd.user}), "t"), "presence");
    auto b2 = login(gw2->port(), ben);
    wait_until([&] { return online_in_db(*pg, ben.user) == "t"; }, 20s, "ben online");
    auto c = login(gw2->port(), cyd);
    auto f = next_presence(*a);
    EXPECT_EQ(str(f, "user"), cyd.user) << "a user no longer watched was pushed";
    EXPECT_TRUE(f.at("online").as_bool());
    // A second connection of an online user changes nothing; its close neither.
    auto c2 = login(gw1->port(), cyd);
    c2.reset();
    c.reset();
    auto g = next_presence(*a);
    EXPECT_EQ(str(g, "user"), cyd.user);
    EXPECT_FALSE(g.at("online").as_bool()) << "a second connection's close was pushed as a change";
}

TEST_F(Ephemeral, a_gateway_killed_with_sigkill_takes_its_users_offline_within_the_lease) {
    auto w = make_world(db(), "preskill", 2);
    const auto &ana = w.users[0], &ben = w.users[1];
    ServerProcess gw3(db(), gateway_flags, "gw-3");
    auto a = login(gw1->port(), ana);
    ASSERT_EQ(str(presence(*a, {ben.user}), "t"), "presence");
    auto b = login(gw3.port(), ben);
    EXPECT_TRUE(next_presence(*a).at("online").as_bool());
    const auto t0 = Clock::now();
    gw3.kill(); // no close reaches anyone: only the lease can tell
    // Contract 13 allows 60 s; with a 1.5 s lease it takes about 2 s.
    auto off = next_presence(*a, 60s);
    std::printf("offline pushed %lld ms after SIGKILL (lease 1500 ms)\n", ms_since(t0));
    EXPECT_EQ(str(off, "user"), ben.user);
    EXPECT_FALSE(off.at("online").as_bool());
    auto r = presence(*a, {ben.user});
    EXPECT_FALSE(r.at("users").as_array()[0].as_object().at("online").as_bool());
    EXPECT_EQ(pg->scalar("SELECT count(*) FROM presence_gateways WHERE gateway_id = 'gw-3'"), "0");
}

// Two gateways close a user's last two connections at the same instant
// (store_presence.cpp's rule: a removal locks the user's presence_users row
// first and decides `online` after the other's removal committed). Without
// that lock each removal sees the other's row still there, and the user
// stays online for ever: no connection is left to correct it. Driven at the
// store, two threads on two database sessions released together, as the two
// gateways' presence writers would be.
TEST_F(Ephemeral, two_gateways_closing_a_users_last_connections_at_once_leave_the_user_offline) {
    pqxx::connection a(db()), b(db());
    const char* gw_a = "race-gw-a";
    const char* gw_b = "race-gw-b";
    const int rounds = 80;
    int stuck_online = 0;
    for (int i = 0; i < rounds; ++i) {
        const std::string u = "presrace-" + std::to_string(i);
        im::Store::presence_write(a, gw_a, 60000, {u}, {}, false, 0);
        im::Store::presence_write(b, gw_b, 60000, {u}, {}, false, 0);
        ASSERT_EQ(online_in_db(*pg, u), "t");
        std::atomic<int> ready{0};
        auto close_last = [&](pqxx::connection& c, const char* gw) {
            ready.fetch_add(1);
            while (ready.load() < 2) std::this_thread::yield();
            im::Store::presence_write(c, gw, 60000, {}, {{u, 1000 + i}}, false, 0);
        };
        std::thread ta(close_last, std::ref(a), gw_a);
        std::thread tb(close_last, std::ref(b), gw_b);
        ta.join();
        tb.join();
        if (online_in_db(*pg, u) != "f") ++stuck_online;
        EXPECT_EQ(pg->scalar("SELECT count(*) FROM presence_online WHERE user_id = " + q(u)), "0");
    }
    EXPECT_EQ(stuck_online, 0) << stuck_online << " of " << rounds << " users left online with no connection";
    im::Store::presence_release(a, gw_a, 0);
    im::Store::presence_release(b, gw_b, 0);
}

TEST_F(Ephemeral, a_gateway_restarted_under_its_id_keeps_returning_users_online_and_drops_the_others) {
    auto w = make_world(db(), "presre", 3);
    const auto &ana = w.users[0], &ben = w.users[1], &cyd = w.users[2];
    // A lease long enough that the restart comes before any sweep: what
    // happens is the restarted gateway's own doing (its claim, one beat
    // after its start: 20000 / 3 ms).
    ServerProcess gwr(db(), {"--quiet", "--presence-lease-ms", "20000"}, "gw-restart");
    auto a = login(gw1->port(), ana);
    ASSERT_EQ(str(presence(*a, {ben.user, cyd.user}), "t"), "presence");
    {
        auto b = login(gwr.port(), ben);
        auto c = login(gwr.port(), cyd);
        for (int i = 0; i < 2; ++i) EXPECT_TRUE(next_presence(*a).at("online").as_bool());
        gwr.kill();
    }
    gwr.restart_on_same_port();
    auto b = login(gwr.port(), ben); // ben comes back, cyd does not
    // cyd goes offline at the claim; ben, back before it, never flapped:
    // an offline push of ben's would have come first.
    auto f = next_presence(*a, 30s);
    EXPECT_EQ(str(f, "user"), cyd.user) << json::serialize(f);
    EXPECT_FALSE(f.at("online").as_bool());
    auto r = presence(*a, {ben.user});
    EXPECT_TRUE(r.at("users").as_array()[0].as_object().at("online").as_bool());
}

// ----------------------------------------------------------------- NATS

/// A nats-server child on a free port.
class Nats {
public:
    Nats() : port_(free_port()) {
        std::vector<std::string> args = {"nats-server", "-a", "127.0.0.1", "-p", std::to_string(port_)};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (posix_spawnp(&pid_, "nats-server", nullptr, nullptr, argv.data(), environ) != 0)
            throw std::runtime_error("cannot start nats-server");
    }
    ~Nats() {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
    std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

private:
    unsigned short port_;
    pid_t pid_ = -1;
};

TEST_F(Ephemeral, typing_and_presence_cross_gateways_on_nats_too) {
    Nats nats;
    auto flags = gateway_flags;
    flags.insert(flags.end(), {"--bus", nats.url()});
    ServerProcess n1(db(), flags, "gw-n1"), n2(db(), flags, "gw-n2");
    for (auto* s : {&n1, &n2}) wait_until([&] { return s->http("GET", "/readyz").first == 200; }, 30s, "NATS bus up");
    auto w = make_world(db(), "nats13", 2);
    const auto &ana = w.users[0], &ben = w.users[1];
    auto a = login(n1.port(), ana);
    ASSERT_EQ(str(presence(*a, {ben.user}), "t"), "presence");
    auto b = subscribed(n2.port(), ben);
    auto on = next_presence(*a);
    EXPECT_EQ(str(on, "user"), ben.user);
    EXPECT_TRUE(on.at("online").as_bool());
    EXPECT_EQ(str(typing(*a, w.conv, true), "t"), "typing_ok");
    auto f = next_typing(*b);
    EXPECT_EQ(str(f, "user"), ana.user);
    EXPECT_EQ(str(f, "conv"), w.conv);
}

} // namespace
