// Push delivery: every notification the gateway has received is fanned out
// before it goes back to sleep, and replies go out without Nagle's delay.
#include "common.hpp"

#include <filesystem>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <optional>

using namespace im::test;

namespace {

// The notifier's idle wake-up (its liveness probe) is set to a minute here, so
// a notification left behind inside the database client library would only
// be handled a minute later: far beyond the waits below. A test that passes
// therefore shows the notifier drained everything it had taken in.
const std::vector<std::string> slow_probe = {"--quiet", "--listen-probe-ms", "60000"};

TEST(Push, a_burst_of_commits_across_conversations_is_pushed_completely_without_waiting_for_the_next_one) {
    TestPostgres pg;
    // Senders on one gateway, the watcher on another: every push it gets
    // came through the bus (a gateway serves its own subscribers directly).
    ServerProcess srv(pg.url(), slow_probe, "gw-send");
    ServerProcess watch(pg.url(), slow_probe, "gw-watch");
    constexpr int convs = 12;
    constexpr int rounds = 8;
    auto sender = make_user(pg.url(), unique_name("burst-s"));
    auto watcher = make_user(pg.url(), unique_name("burst-w"));
    std::vector<std::string> ids;
    for (int i = 0; i < convs; ++i) {
        ids.push_back(unique_name("burst"));
        admin_ok(pg.url(), {"conv", "create", ids.back(), "--kind", "group", "--members",
                            sender.user + "," + watcher.user});
    }
    auto w = login(watch.port(), watcher);
    ASSERT_EQ(str(w->request({{"t", "sub"}}), "t"), "subscribed");
    // One connection per conversation, all sending at once: commits land
    // while the notifier is busy reading the rows of earlier ones.
    std::vector<std::unique_ptr<WsClient>> senders;
    for (int i = 0; i < convs; ++i) senders.push_back(login(srv.port(), sender));
    // Each round: every conversation commits three pipelined sends at once,
    // then every event must reach the watcher, in seq order per conversation
    // (three of a conversation are in flight together, so an order the
    // notifier does not keep shows), before the next round starts (nothing
    // later could wake a notifier that fell asleep with a notification still
    // in hand).
    constexpr int per_round = 3;
    std::map<std::string, std::int64_t> last_seq, seen;
    for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < convs; ++i)
            for (int k = 0; k < per_round; ++k) {
                const std::string n = std::to_string(r) + "-" + std::to_string(k);
                senders[i]->send_json(
                    {{"t", "send"}, {"rid", "r" + n}, {"conv", ids[i]}, {"cmid", "m" + n}, {"body", "burst " + n}});
            }
        for (int i = 0; i < convs; ++i)
            for (int k = 0; k < per_round; ++k) {
                auto reply = senders[i]->next(20s);
                ASSERT_TRUE(reply);
                ASSERT_EQ(str(*reply, "t"), "sent") << json::serialize(*reply);
                last_seq[ids[i]] = std::max(last_seq[ids[i]], num(*reply, "seq"));
            }
        int pushed = 0;
        while (pushed < convs * per_round) {
            auto f = w->next_push(20s);
            ASSERT_TRUE(f) << "round " << r << ": only " << pushed << " of " << convs * per_round << " pushes arrived";
            if (str(*f, "t") != "event") continue;
            const auto& ev = f->at("ev").as_object();
            const std::string conv = str(ev, "conv");
            ASSERT_TRUE(last_seq.count(conv)) << json::serialize(*f);
            auto& prev = seen[conv];
            if (prev == 0) prev = num(ev, "seq") - 1;
            EXPECT_EQ(num(ev, "seq"), prev + 1) << "out of order in " << conv;
            prev = num(ev, "seq");
            ++pushed;
        }
        for (const auto& [conv, seq] : last_seq) EXPECT_EQ(seen[conv], seq) << "round " << r << " " << conv;
    }
}

// docs/operations.md, "--fanout-cache-members": the fan-out's membership
// cache stays within its cap (a conversation costs one plus its periods)
// however many conversations it serves, dropping the least recently pushed
// ones, and every push still arrives, in order. Six groups of 10 members
// (66 units) through a cap of 40: the cache must evict, round after round.
TEST(Push, the_fanout_cache_stays_within_its_cap_and_every_push_still_arrives) {
    TestPostgres pg;
    constexpr long long cap = 40;
    ServerProcess srv(pg.url(), slow_probe, "gw-send");
    auto flags = slow_probe;
    flags.insert(flags.end(), {"--fanout-cache-members", std::to_string(cap)});
    ServerProcess watch(pg.url(), flags, "gw-watch");
    auto sender = make_user(pg.url(), unique_name("cap-s"));
    auto watcher = make_user(pg.url(), unique_name("cap-w"));
    constexpr int convs = 6, fillers = 8, rounds = 5;
    const std::string prefix = unique_name("capf");
    pg.scalar("INSERT INTO users (user_id) SELECT '" + prefix + "-' || g FROM generate_series(1, " +
              std::to_string(convs * fillers) + ") g");
    std::vector<std::string> ids;
    for (int i = 0; i < convs; ++i) {
        ids.push_back(unique_name("cap"));
        std::string members = sender.user + "," + watcher.user;
        for (int f = 1; f <= fillers; ++f) members += "," + prefix + "-" + std::to_string(i * fillers + f);
        admin_ok(pg.url(), {"conv", "create", ids.back(), "--kind", "group", "--members", members});
    }
    auto w = login(watch.port(), watcher);
    ASSERT_EQ(str(w->request({{"t", "sub"}}), "t"), "subscribed");
    auto c = login(srv.port(), sender);
    std::map<std::string, std::int64_t> seen;
    for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < convs; ++i) {
            const std::string n = std::to_string(r) + "-" + std::to_string(i);
            ASSERT_EQ(str(send_msg(*c, ids[i], "m" + n, "round " + n), "t"), "sent");
            // Each push before the next send: the cache turns over conversation by conversation.
            std::optional<json::object> f;
            do f = w->next_push(20s);
            while (f && str(*f, "t") != "event");
            ASSERT_TRUE(f) << "round " << r << ": no push for " << ids[i];
            const auto& ev = f->at("ev").as_object();
            EXPECT_EQ(str(ev, "conv"), ids[i]) << json::serialize(*f);
            auto& prev = seen[ids[i]];
            if (prev != 0) {
                EXPECT_EQ(num(ev, "seq"), prev + 1) << "out of order in " << ids[i];
            }
            prev = num(ev, "seq");
            const long long cached = watch.metric("im_fanout_cache_members");
            EXPECT_GE(cached, 1);
            EXPECT_LE(cached, cap) << "round " << r << ", conversation " << i;
        }
    }
    EXPECT_GE(watch.metric("im_fanout_cache_evictions_total"), convs) << "the cap never took effect";
}

// The server's side of a connection must carry TCP_NODELAY: a send puts two
// small frames on the sender's socket (its own pushed event and the reply),
// and without it the second waits for the client's delayed ACK (~40 ms).
// The test borrows the server's accepted sockets (pidfd_getfd: the server is
// our child) and reads the option itself.
std::vector<int> accepted_sockets(pid_t pid, unsigned short port) {
    std::vector<int> out;
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return out;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
        int target = std::atoi(entry.path().filename().c_str());
        int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, target, 0));
        if (fd < 0) continue;
        sockaddr_in local{}, peer{};
        socklen_t ll = sizeof local, pl = sizeof peer;
        int type = 0;
        socklen_t tl = sizeof type;
        bool ours = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) == 0 && local.sin_family == AF_INET &&
                    ntohs(local.sin_port) == port && ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0;
        if (ours) out.push_back(fd);
        else ::close(fd);
    }
    ::close(pidfd);
    return out;
}

TEST(Push, accepted_sockets_have_nodelay) {
    TestPostgres pg;
    ServerProcess srv(pg.url(), {"--quiet"});
    auto w = make_world(pg.url(), "nodelay", 1);
    WsClient ws(srv.port());
    ASSERT_EQ(str(ws.hello(w.users[0].token), "t"), "welcome");
    auto socks = accepted_sockets(srv.pid(), srv.port());
    ASSERT_EQ(socks.size(), 1u) << "expected the one accepted WebSocket connection";
    for (int fd : socks) {
        int on = 0;
        socklen_t len = sizeof on;
        ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
        EXPECT_NE(on, 0) << "accepted socket without TCP_NODELAY";
        ::close(fd);
    }
}

// Issue 28, item 3: with the PostgreSQL bus a send's notification goes out
// with its own COMMIT (pg_notify inside im_send), so its reply waits for no
// second transaction: the gateway that committed never opens the bus's
// publishing session for it, and another gateway still gets the push.
// --notify-in-commit off is the previous path, and the control: the same
// send then goes through the publishing session and its publish stage.
TEST(Push, a_sends_notification_goes_out_with_its_commit) {
    TestPostgres pg;
    ServerProcess in_commit(pg.url(), slow_probe, "gw-commit");
    ServerProcess after(pg.url(), {"--quiet", "--listen-probe-ms", "60000", "--notify-in-commit", "off"}, "gw-after");
    ServerProcess watch(pg.url(), slow_probe, "gw-watch");
    auto w = make_world(pg.url(), "incommit", 2);
    auto watcher = login(watch.port(), w.users[1]);
    ASSERT_EQ(str(watcher->request({{"t", "sub"}}), "t"), "subscribed");
    auto publishers = [&](const std::string& gw) {
        return pg.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'imserver-notify-" + gw + "'");
    };
    struct Case {
        ServerProcess* gw;
        std::string name, publishers;
        bool published; // the replies waited for the bus's publish (its stage histogram)
    };
    for (const auto& c : {Case{&in_commit, "gw-commit", "0", false}, Case{&after, "gw-after", "1", true}}) {
        SCOPED_TRACE(c.name);
        auto sender = login(c.gw->port(), w.users[0]);
        // Two sends, one after the other: each reply, then its push on the
        // third gateway, which only the bus can have told.
        for (int i = 0; i < 2; ++i) {
            auto sent = send_msg(*sender, w.conv, c.name + "-" + std::to_string(i), "hello");
            ASSERT_EQ(str(sent, "t"), "sent") << json::serialize(sent);
            const std::int64_t seq = num(sent, "seq");
            auto pushed = watcher->wait_push(
                [&](const json::object& o) { return str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == seq; },
                20s);
            ASSERT_TRUE(pushed.has_value()) << "seq " << seq << " was not pushed on the other gateway";
        }
        EXPECT_EQ(publishers(c.name), c.publishers) << "the bus's publishing sessions of " << c.name;
        const long long publish_stage = c.gw->metric("im_send_stage_seconds_count{stage=\"publish\"}");
        ASSERT_GE(publish_stage, 0) << "no publish stage in /metrics";
        EXPECT_EQ(publish_stage > 0, c.published) << publish_stage << " runs waited for the bus's publish";
    }
}

} // namespace
