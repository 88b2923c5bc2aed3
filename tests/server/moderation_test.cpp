// Rate limits and moderation (spec/server.md, "Rate limits and moderation";
// issue 52 items 2-4): a real imserver with --send-rate/--send-burst and the
// backend API, a real PostgreSQL. Sends, edits and reactions over the
// user's bucket answer RATE_LIMITED with retry_ms and write nothing; a resend
// after retry_ms lands.
#include "common.hpp"

#include "core/write_limiter.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <fstream>
#include <set>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

using namespace im::test;

namespace {

// A burst of 5 and 2 a second: small enough to reach at once, slow enough
// that the refill in a test's round trips stays below one token.
const std::vector<std::string> mod_flags = {"--quiet", "--api-listen", "127.0.0.1:0", "--send-rate", "2",
                                            "--send-burst", "5"};

class Moderation : public ::testing::Test {
protected:
    static inline TestPostgres* pg = nullptr;
    static inline ServerProcess* srv = nullptr;
    // A second gateway on the same database without the limit, for the
    // mute and redaction tests (their writes must not meet the bucket).
    static inline ServerProcess* free_srv = nullptr;
    static inline std::string admin_key;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        srv = new ServerProcess(pg->url(), mod_flags);
        free_srv = new ServerProcess(pg->url(), {"--quiet"}, "gw-2");
        admin_key = admin_ok(pg->url(), {"apikey", "add", "suite-admin", "--scope", "admin"});
    }
    static void TearDownTestSuite() {
        delete free_srv;
        delete srv;
        delete pg;
    }
    static std::pair<int, json::object> call(const std::string& method, const std::string& target,
                                             const std::string& body = {}) {
        auto [st, text] = srv->api(method, target, body, admin_key);
        json::error_code ec;
        auto v = json::parse(text, ec);
        return {st, !ec && v.is_object() ? v.as_object() : json::object{}};
    }
    static std::string scalar(const std::string& sql) { return pg->scalar(sql); }
};

// The bucket alone (core/write_limiter.hpp), on a clock the test moves.
TEST(WriteLimiterUnit, a_bucket_gives_its_burst_then_one_token_per_period_and_says_how_long_to_wait) {
    im::WriteLimiter lim(4, 3); // 4 a second, 3 at once
    const auto t0 = im::WriteLimiter::Clock::now();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(lim.take("u", t0), 0) << i;
    EXPECT_EQ(lim.take("u", t0), 250);                                 // one token in 250 ms
    EXPECT_EQ(lim.take("u", t0 + std::chrono::milliseconds(100)), 150); // a refused take costs nothing
    EXPECT_EQ(lim.take("u", t0 + std::chrono::milliseconds(250)), 0);
    EXPECT_GT(lim.take("u", t0 + std::chrono::milliseconds(250)), 0);
    EXPECT_EQ(lim.take("other", t0), 0); // per user
    // Never more than the burst after a long quiet spell.
    const auto later = t0 + std::chrono::hours(1);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(lim.take("u", later), 0) << i;
    EXPECT_GT(lim.take("u", later), 0);
}

TEST(WriteLimiterUnit, rate_zero_is_unlimited_and_full_buckets_are_forgotten) {
    im::WriteLimiter off(0, 60);
    const auto t0 = im::WriteLimiter::Clock::now();
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(off.take("u", t0), 0);
    EXPECT_EQ(off.size(), 0u);
    im::WriteLimiter lim(20, 60);
    for (int i = 0; i < 5000; ++i) lim.take("user" + std::to_string(i), t0);
    // 3 s later every bucket is full again: the next new users sweep them out.
    const auto later = t0 + std::chrono::seconds(4);
    for (int i = 0; i < 5000; ++i) lim.take("late" + std::to_string(i), later);
    EXPECT_LE(lim.size(), 5000u + 1024u);
}

std::string code_of(const json::object& o) {
    if (str(o, "t") != "error") return "OK:" + std::string(str(o, "t"));
    return str(o, "code");
}

TEST_F(Moderation, sends_over_the_burst_answer_rate_limited_with_retry_ms_and_write_nothing) {
    auto w = make_world(pg->url(), "rl", 2);
    auto c = login(srv->port(), w.users[0]);
    // Pipelined: all seven are read before the first is answered, so the
    // bucket (5) is what decides, not the time between them.
    std::vector<std::string> cmids;
    for (int i = 0; i < 7; ++i) {
        cmids.push_back(uuid4());
        c->send_json({{"t", "send"}, {"rid", "r" + std::to_string(i)}, {"conv", w.conv}, {"cmid", cmids.back()},
                      {"body", "m" + std::to_string(i)}});
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < 7) {
        auto f = c->next(10s);
        ASSERT_TRUE(f) << "no reply";
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    int ok = 0, limited = 0;
    std::vector<std::string> limited_cmids;
    for (int i = 0; i < 7; ++i) {
        const auto& r = replies["r" + std::to_string(i)];
        if (str(r, "t") == "sent") ++ok;
        else {
            ASSERT_EQ(str(r, "code"), "RATE_LIMITED") << json::serialize(r);
            ASSERT_TRUE(r.contains("retry_ms")) << json::serialize(r);
            EXPECT_GT(num(r, "retry_ms"), 0);
            EXPECT_LE(num(r, "retry_ms"), 500); // one token at 2 a second
            ++limited;
            limited_cmids.push_back(cmids[i]);
        }
    }
    EXPECT_EQ(ok, 5);
    EXPECT_EQ(limited, 2);
    // Nothing written for the limited ones.
    for (const auto& cm : limited_cmids)
        EXPECT_EQ(count_rows(*pg, "client_msg_id = " + q(cm)), "0") << cm;
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "5");
    EXPECT_GE(srv->metric("im_writes_rate_limited_total"), 2);

    // After retry_ms the resend with the same cmid lands, once.
    for (const auto& cm : limited_cmids) {
        json::object r;
        for (int attempt = 0; attempt < 20; ++attempt) {
            r = send_msg(*c, w.conv, cm, "again");
            if (str(r, "t") == "sent") break;
            ASSERT_EQ(str(r, "code"), "RATE_LIMITED") << json::serialize(r);
            std::this_thread::sleep_for(std::chrono::milliseconds(num(r, "retry_ms")));
        }
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        EXPECT_EQ(count_rows(*pg, "client_msg_id = " + q(cm)), "1");
    }
}

TEST_F(Moderation, edits_and_reactions_take_from_the_same_bucket_and_another_user_is_not_limited) {
    auto w = make_world(pg->url(), "rle", 2);
    auto a = login(srv->port(), w.users[0]);
    auto b = login(srv->port(), w.users[1]);
    auto sent = send_msg(*a, w.conv, uuid4(), "target");
    ASSERT_EQ(str(sent, "t"), "sent") << json::serialize(sent);
    const auto target = num(sent, "seq");
    // Four more pipelined writes empty a's bucket (5): edits and reactions.
    for (int i = 0; i < 4; ++i) {
        if (i % 2)
            a->send_json({{"t", "edit"}, {"rid", "e" + std::to_string(i)}, {"conv", w.conv}, {"target", target},
                          {"cmid", uuid4()}, {"body", "edit " + std::to_string(i)}});
        else
            a->send_json({{"t", "react"}, {"rid", "e" + std::to_string(i)}, {"conv", w.conv}, {"target", target},
                          {"cmid", uuid4()}, {"emoji", "x" + std::to_string(i)}, {"on", true}});
    }
    a->send_json({{"t", "edit"}, {"rid", "over-edit"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                  {"body", "over"}});
    a->send_json({{"t", "react"}, {"rid", "over-react"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                  {"emoji", "over"}, {"on", true}});
    std::map<std::string, json::object> replies;
    while (replies.size() < 6) {
        auto f = a->next(10s);
        ASSERT_TRUE(f) << "no reply";
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    for (int i = 0; i < 4; ++i)
        EXPECT_NE(str(replies["e" + std::to_string(i)], "t"), "error") << json::serialize(replies["e" + std::to_string(i)]);
    EXPECT_EQ(code_of(replies["over-edit"]), "RATE_LIMITED");
    EXPECT_TRUE(replies["over-edit"].contains("retry_ms"));
    EXPECT_EQ(code_of(replies["over-react"]), "RATE_LIMITED");
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND body = 'over'"), "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM events WHERE conv_id = " + q(w.conv) + " AND kind = 'reaction' AND "
                     "emoji = 'over'"), "0");
    // The other member's bucket is their own.
    auto other = send_msg(*b, w.conv, uuid4(), "from b");
    EXPECT_EQ(str(other, "t"), "sent") << json::serialize(other);
}

TEST_F(Moderation, the_backend_apis_sends_are_not_limited) {
    auto w = make_world(pg->url(), "rlapi", 2);
    for (int i = 0; i < 8; ++i) {
        auto [st, o] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                            json::serialize(json::object{{"sender", w.users[0].user}, {"cmid", uuid4()},
                                                         {"body", "api " + std::to_string(i)}}));
        EXPECT_TRUE(st == 200 || st == 201) << st << " " << json::serialize(o);
    }
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg'"), "8");
}

// ---------------------------------------------------------------- mutes

TEST_F(Moderation, a_muted_member_gets_muted_on_every_write_reads_on_and_writes_again_once_unmuted) {
    auto w = make_world(pg->url(), "mute", 2);
    auto a = login(free_srv->port(), w.users[0]);
    auto b = login(free_srv->port(), w.users[1]);
    const std::string before_cmid = uuid4();
    auto first = send_msg(*a, w.conv, before_cmid, "before the mute");
    ASSERT_EQ(str(first, "t"), "sent") << json::serialize(first);
    const auto target = num(first, "seq");

    auto [st, o] = call("PUT", "/v1/conversations/" + w.conv + "/mutes/" + w.users[0].user, "{}");
    ASSERT_EQ(st, 200) << json::serialize(o);
    EXPECT_TRUE(o.at("until").is_null());
    const std::string rows = count_rows(*pg, "conv_id = " + q(w.conv));

    const std::string muted_cmid = uuid4();
    EXPECT_EQ(code_of(send_msg(*a, w.conv, muted_cmid, "while muted")), "MUTED");
    EXPECT_EQ(code_of(a->request({{"t", "edit"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                                  {"body", "edited while muted"}})),
              "MUTED");
    EXPECT_EQ(code_of(a->request({{"t", "react"}, {"conv", w.conv}, {"target", target}, {"cmid", uuid4()},
                                  {"emoji", "m"}, {"on", true}})),
              "MUTED");
    EXPECT_EQ(code_of(a->request({{"t", "typing"}, {"conv", w.conv}, {"on", true}})), "MUTED");
    // Nothing written; the resend of what was sent before the mute is still its duplicate.
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv)), rows);
    auto dup = send_msg(*a, w.conv, before_cmid, "before the mute");
    EXPECT_EQ(str(dup, "t"), "sent") << json::serialize(dup);
    EXPECT_TRUE(dup.at("dup").as_bool());
    // Reads go on.
    auto page = sync_conv(*a, w.conv, 0);
    EXPECT_NE(str(page, "t"), "error") << json::serialize(page);
    // The other member is not muted.
    EXPECT_EQ(code_of(send_msg(*b, w.conv, uuid4(), "b speaks")), "OK:sent");
    // The backend API's send on the muted user's behalf is refused too (403 MUTED).
    auto [st_api, o_api] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                                json::serialize(json::object{{"sender", w.users[0].user}, {"cmid", uuid4()},
                                                             {"body", "api while muted"}}));
    EXPECT_EQ(st_api, 403) << json::serialize(o_api);
    EXPECT_EQ(str(o_api, "code"), "MUTED");

    auto [st2, o2] = call("DELETE", "/v1/conversations/" + w.conv + "/mutes/" + w.users[0].user);
    ASSERT_EQ(st2, 200) << json::serialize(o2);
    EXPECT_TRUE(o2.at("removed").as_bool());
    EXPECT_EQ(code_of(send_msg(*a, w.conv, muted_cmid, "while muted")), "OK:sent");
    EXPECT_FALSE(call("DELETE", "/v1/conversations/" + w.conv + "/mutes/" + w.users[0].user).second.at("removed").as_bool());
}

TEST_F(Moderation, a_time_limited_mute_ends_by_itself) {
    auto w = make_world(pg->url(), "mutet", 2);
    auto a = login(free_srv->port(), w.users[0]);
    const std::string until = scalar("SELECT to_char((clock_timestamp() + interval '1500 ms') AT TIME ZONE 'UTC', "
                                     "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')");
    auto [st, o] = call("PUT", "/v1/conversations/" + w.conv + "/mutes/" + w.users[0].user,
                        json::serialize(json::object{{"until", until}}));
    ASSERT_EQ(st, 200) << json::serialize(o);
    EXPECT_EQ(str(o, "until"), until);
    const std::string cmid = uuid4();
    EXPECT_EQ(code_of(send_msg(*a, w.conv, cmid, "too early")), "MUTED");
    // MUTED is terminal for the client; a new draft after the end goes through.
    wait_until([&] { return code_of(send_msg(*a, w.conv, uuid4(), "later")) == "OK:sent"; }, 10s,
               "the mute to end");
    // Bad input writes nothing.
    EXPECT_EQ(call("PUT", "/v1/conversations/" + w.conv + "/mutes/" + w.users[0].user,
                   json::serialize(json::object{{"until", "next tuesday"}})).first, 400);
    EXPECT_EQ(call("PUT", "/v1/conversations/nope-" + w.conv + "/mutes/" + w.users[0].user, "{}").first, 404);
    EXPECT_EQ(call("PUT", "/v1/conversations/" + w.conv + "/mutes/nobody-" + w.users[0].user, "{}").first, 404);
    EXPECT_EQ(scalar("SELECT count(*) FROM conversation_mutes WHERE conv_id = " + q(w.conv) +
                     " AND until > clock_timestamp()"), "0");
}

TEST_F(Moderation, the_admin_cli_mutes_and_unmutes) {
    auto w = make_world(pg->url(), "mutecli", 2);
    auto a = login(free_srv->port(), w.users[0]);
    EXPECT_EQ(admin_ok(pg->url(), {"mute", "set", w.conv, w.users[0].user, "--for", "1h"}).empty(), false);
    EXPECT_EQ(code_of(send_msg(*a, w.conv, uuid4(), "x")), "MUTED");
    admin_ok(pg->url(), {"mute", "clear", w.conv, w.users[0].user});
    EXPECT_EQ(code_of(send_msg(*a, w.conv, uuid4(), "y")), "OK:sent");
}

// ---------------------------------------------------------------- redaction

TEST_F(Moderation, redact_appends_an_operator_recall_whatever_the_window_and_again_answers_the_same) {
    auto w = make_world(pg->url(), "red", 2);
    admin_ok(pg->url(), {"conv", "set", w.conv, "--recall-window-ms", "0"}); // the sender could not recall
    auto a = login(free_srv->port(), w.users[0]);
    auto b = login(free_srv->port(), w.users[1]);
    ASSERT_EQ(str(b->request({{"t", "sub"}}), "t"), "subscribed");
    auto sent = send_msg(*a, w.conv, uuid4(), "regrettable");
    ASSERT_EQ(str(sent, "t"), "sent");
    const auto target = num(sent, "seq");
    auto [st, o] = call("POST", "/v1/conversations/" + w.conv + "/messages/" + std::to_string(target) + "/redact");
    ASSERT_EQ(st, 200) << json::serialize(o);
    EXPECT_FALSE(o.at("already").as_bool());
    const auto recall_seq = o.at("seq").as_int64();
    EXPECT_EQ(recall_seq, target + 1);
    EXPECT_EQ(scalar("SELECT kind || '|' || coalesce(sender_user, 'null') || '|' || target_seq FROM events WHERE "
                     "conv_id = " + q(w.conv) + " AND seq = " + std::to_string(recall_seq)),
              "recall|null|" + std::to_string(target));
    // In a member's page: a recall with sender null, the msg shown recalled.
    auto page = sync_conv(*b, w.conv, 0);
    bool seen = false, shown_recalled = false;
    for (const auto& e : page.at("events").as_array()) {
        const auto& ev = e.as_object();
        if (num(ev, "seq") == recall_seq) {
            seen = true;
            EXPECT_TRUE(ev.at("sender").is_null()) << json::serialize(ev);
            EXPECT_EQ(num(ev, "target"), target);
        }
        if (num(ev, "seq") == target) shown_recalled = ev.contains("recalled") && ev.at("recalled").as_bool();
    }
    EXPECT_TRUE(seen) << json::serialize(page);
    EXPECT_TRUE(shown_recalled) << json::serialize(page);
    // Members learn of it as of any event (a push or hint).
    auto pushed = b->wait_push(
        [&](const json::object& f) {
            return (str(f, "t") == "event" && f.at("ev").as_object().at("seq").as_int64() == recall_seq) ||
                   (str(f, "t") == "hint" && str(f, "conv") == w.conv);
        },
        10s);
    ASSERT_TRUE(pushed) << "the redaction was not pushed";
    if (str(*pushed, "t") == "event") {
        EXPECT_TRUE(pushed->at("ev").as_object().at("sender").is_null());
    }
    auto [st2, o2] = call("POST", "/v1/conversations/" + w.conv + "/messages/" + std::to_string(target) + "/redact");
    ASSERT_EQ(st2, 200);
    EXPECT_TRUE(o2.at("already").as_bool());
    EXPECT_EQ(o2.at("seq").as_int64(), recall_seq);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "1");
    // Not a msg, or no such event: nothing written.
    EXPECT_EQ(call("POST", "/v1/conversations/" + w.conv + "/messages/1/redact").first, 400); // a join
    EXPECT_EQ(call("POST", "/v1/conversations/" + w.conv + "/messages/9999/redact").first, 404);
    EXPECT_EQ(call("POST", "/v1/conversations/" + w.conv + "/messages/x1/redact").first, 400);
    EXPECT_EQ(count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'recall'"), "1");
}

TEST_F(Moderation, redact_all_of_a_user_recalls_each_msg_once_in_batches_and_a_rerun_finds_nothing_left) {
    auto w = make_world(pg->url(), "redall", 2);
    // 1,203 msgs of a (more than two batches of 500) and some of b, written directly by the API.
    for (int i = 0; i < 1203; ++i) {
        auto [st, o] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                            json::serialize(json::object{{"sender", w.users[i % 7 == 0 ? 1 : 0].user},
                                                         {"cmid", "m" + std::to_string(i)}, {"body", "x"}}));
        ASSERT_EQ(st, 200) << json::serialize(o);
    }
    const std::string mine = count_rows(*pg, "conv_id = " + q(w.conv) + " AND kind = 'msg' AND sender_user = " +
                                                 q(w.users[0].user));
    auto [st, o] = call("POST", "/v1/users/" + w.users[0].user + "/redact",
                        json::serialize(json::object{{"conv", w.conv}}));
    ASSERT_EQ(st, 200) << json::serialize(o);
    EXPECT_EQ(std::to_string(o.at("redacted").as_int64()), mine);
    EXPECT_EQ(scalar("SELECT count(*) FROM events e WHERE e.conv_id = " + q(w.conv) + " AND e.kind = 'msg' AND "
                     "e.sender_user = " + q(w.users[0].user) + " AND NOT EXISTS (SELECT 1 FROM events r WHERE "
                     "r.conv_id = e.conv_id AND r.kind = 'recall' AND r.target_seq = e.seq AND r.sender_user IS NULL)"),
              "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM events e WHERE e.conv_id = " + q(w.conv) + " AND e.kind = 'recall' AND "
                     "e.target_seq IN (SELECT seq FROM events WHERE conv_id = " + q(w.conv) + " AND sender_user = " +
                     q(w.users[1].user) + ")"),
              "0");
    // Seqs gap-free.
    EXPECT_EQ(scalar("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + q(w.conv)), "0");
    EXPECT_EQ(call("POST", "/v1/users/" + w.users[0].user + "/redact",
                   json::serialize(json::object{{"conv", w.conv}})).second.at("redacted").as_int64(), 0);
    EXPECT_EQ(admin_ok(pg->url(), {"redact", "user", w.conv, w.users[0].user}), "0");
}

// ---------------------------------------------------------------- a user's data (issue 52 item 4)

// The lines of an NDJSON body, each parsed.
std::vector<json::object> ndjson(const std::string& body) {
    std::vector<json::object> out;
    std::size_t at = 0;
    while (at < body.size()) {
        auto nl = body.find('\n', at);
        if (nl == std::string::npos) nl = body.size();
        if (nl > at) out.push_back(json::parse(body.substr(at, nl - at)).as_object());
        at = nl + 1;
    }
    return out;
}

// A field of the process's /proc status in kB (VmRSS, VmHWM).
long long proc_kb(pid_t pid, const std::string& field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
    return -1;
}

TEST_F(Moderation, export_streams_ndjson_of_everything_stored_for_the_user_equal_to_the_rows) {
    auto w = make_world(pg->url(), "exp", 2);
    const auto& ana = w.users[0];
    auto a = login(free_srv->port(), ana);
    auto b = login(free_srv->port(), w.users[1]);
    std::vector<std::int64_t> seqs;
    for (int i = 0; i < 3; ++i) {
        auto r = send_msg(*a, w.conv, uuid4(), "line \"" + std::to_string(i) + "\"\n\u00e9");
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        seqs.push_back(num(r, "seq"));
    }
    auto theirs = send_msg(*b, w.conv, uuid4(), "ben's");
    ASSERT_EQ(str(theirs, "t"), "sent");
    auto ed = a->request({{"t", "edit"}, {"conv", w.conv}, {"cmid", uuid4()}, {"target", seqs[0]}, {"body", "fixed"}});
    ASSERT_EQ(str(ed, "t"), "edited") << json::serialize(ed);
    auto re = a->request({{"t", "react"}, {"conv", w.conv}, {"cmid", uuid4()}, {"target", num(theirs, "seq")},
                          {"emoji", "\U0001F44D"}, {"on", true}});
    ASSERT_EQ(str(re, "t"), "reacted") << json::serialize(re);
    ASSERT_EQ(str(a->request({{"t", "read"}, {"conv", w.conv}, {"seq", num(theirs, "seq")}}), "t"), "read_ok");

    auto [st, body] = srv->api("GET", "/v1/users/" + ana.user + "/export", "", admin_key);
    ASSERT_EQ(st, 200) << body;
    const auto lines = ndjson(body);
    ASSERT_GE(lines.size(), 3u);
    EXPECT_EQ(str(lines.front(), "type"), "user");
    EXPECT_EQ(str(lines.front(), "user"), ana.user);
    EXPECT_EQ(str(lines.back(), "type"), "end");
    EXPECT_EQ(num(lines.back(), "records"), static_cast<std::int64_t>(lines.size()) - 1);
    std::map<std::string, int> types;
    std::map<std::int64_t, json::object> events;
    for (const auto& l : lines) {
        ++types[str(l, "type")];
        if (str(l, "type") == "event") events[num(l, "seq")] = l;
    }
    EXPECT_EQ(std::to_string(types["device"]),
              scalar("SELECT count(*) FROM devices WHERE user_id = " + q(ana.user)));
    EXPECT_EQ(std::to_string(types["membership"]),
              scalar("SELECT count(*) FROM membership_periods WHERE user_id = " + q(ana.user)));
    EXPECT_EQ(types["read_marker"], 1);
    // Their events, each equal to its row: 3 msgs, the edit, the reaction.
    EXPECT_EQ(std::to_string(events.size()), count_rows(*pg, "sender_user = " + q(ana.user)));
    EXPECT_EQ(events.size(), 5u);
    for (const auto& [seq, ev] : events) {
        const std::string where = "conv_id = " + q(w.conv) + " AND seq = " + std::to_string(seq);
        EXPECT_EQ(str(ev, "kind"), scalar("SELECT kind FROM events WHERE " + where));
        EXPECT_EQ(ev.contains("body") ? std::string(ev.at("body").as_string()) : std::string("<none>"),
                  scalar("SELECT coalesce(body, '<none>') FROM events WHERE " + where));
        EXPECT_EQ(str(ev, "cmid"), scalar("SELECT client_msg_id FROM events WHERE " + where));
    }
    EXPECT_EQ(str(events.at(seqs[1]), "body"), "line \"1\"\n\u00e9");
    // Nobody else's events; an unknown user is 404; a read key may export (a
    // GET: server.md, "Scopes").
    for (const auto& [seq, ev] : events) EXPECT_EQ(str(ev, "sender"), ana.user);
    EXPECT_EQ(srv->api("GET", "/v1/users/nobody-here/export", "", admin_key).first, 404);
    const std::string read_key = admin_ok(pg->url(), {"apikey", "add", unique_name("exp-read"), "--scope", "read"});
    EXPECT_EQ(srv->api("GET", "/v1/users/" + ana.user + "/export", "", read_key).first, 200);
    // The admin CLI writes the same lines.
    EXPECT_EQ(ndjson(admin_ok(pg->url(), {"user", "export", ana.user}) + "\n").size(), lines.size());
}

// 50,000 msgs of about 1 KB (a 55 MB export) read by a slow client: the
// gateway's memory grows by far less than the export (one chunk at a time).
TEST_F(Moderation, a_big_export_streams_without_the_gateway_holding_the_result) {
    auto w = make_world(pg->url(), "bigexp", 2);
    const auto& ana = w.users[0];
    const int n = 50000;
    const std::string conv = q(w.conv);
    pg->scalar("WITH c AS (SELECT next_seq - 1 AS base, msg_count FROM conversations WHERE conv_id = " + conv + "), "
               "i AS (INSERT INTO events (conv_id, seq, kind, sender_user, client_msg_id, request_hash, body, epoch, "
               "msg_ordinal, sender_ordinal) SELECT " + conv + ", c.base + g, 'msg', " + q(ana.user) +
               ", 'bulk-' || g, sha256(convert_to('x' || g, 'UTF8')), g || ' ' || repeat('x', 1000), 1, "
               "c.msg_count + g, g FROM c, generate_series(1, " + std::to_string(n) + ") g RETURNING 1) "
               "UPDATE conversations SET next_seq = next_seq + (SELECT count(*) FROM i), "
               "msg_count = msg_count + " + std::to_string(n) + " WHERE conv_id = " + conv + " RETURNING next_seq");
    ASSERT_EQ(scalar("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + conv), "0");
    const pid_t pid = srv->pid();
    const long long rss_before = proc_kb(pid, "VmRSS");
    ASSERT_GT(rss_before, 0);

    namespace net = boost::asio;
    namespace beast = boost::beast;
    namespace http = beast::http;
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), srv->api_port()));
    http::request<http::empty_body> req{http::verb::get, "/v1/users/" + ana.user + "/export", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::authorization, "Bearer " + admin_key);
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    http::read_header(stream, buf, p);
    ASSERT_EQ(p.get().result_int(), 200);
    EXPECT_EQ(p.get()[http::field::content_type], "application/x-ndjson");
    std::string partial;
    long long bytes = 0, events = 0, peak = rss_before;
    std::int64_t last_seq = 0;
    bool ordered = true, ended = false;
    char piece[16384];
    int reads = 0;
    while (!p.is_done()) {
        p.get().body().data = piece;
        p.get().body().size = sizeof piece;
        beast::error_code ec;
        http::read(stream, buf, p, ec);
        if (ec && ec != http::error::need_buffer) FAIL() << ec.message();
        const std::size_t got = sizeof piece - p.get().body().size;
        bytes += static_cast<long long>(got);
        partial.append(piece, got);
        std::size_t nl;
        while ((nl = partial.find('\n')) != std::string::npos) {
            auto o = json::parse(partial.substr(0, nl)).as_object();
            partial.erase(0, nl + 1);
            if (str(o, "type") == "event") {
                ++events;
                if (num(o, "seq") <= last_seq) ordered = false;
                last_seq = num(o, "seq");
            }
            if (str(o, "type") == "end") ended = true;
        }
        // A slow reader: the gateway must wait, not buffer ahead.
        if (++reads % 64 == 0) {
            peak = std::max(peak, proc_kb(pid, "VmRSS"));
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    }
    peak = std::max(peak, proc_kb(pid, "VmRSS"));
    EXPECT_TRUE(ended);
    EXPECT_TRUE(ordered);
    EXPECT_EQ(events, n);
    EXPECT_GT(bytes, 50LL * 1000 * 1000);
    const long long grown_kb = peak - rss_before;
    std::cout << "export of " << bytes / 1000 / 1000 << " MB: gateway RSS " << rss_before / 1024 << " MB before, peak "
              << peak / 1024 << " MB\n";
    EXPECT_LT(grown_kb * 1024, bytes / 5) << "the gateway's memory grew by " << grown_kb / 1024 << " MB for a "
                                          << bytes / 1000 / 1000 << " MB export";
}

TEST_F(Moderation, erase_revokes_closes_recalls_and_empties_their_events_keeps_seqs_and_tombstones) {
    auto w = make_world(pg->url(), "era", 3);
    const auto& ana = w.users[0];
    admin_ok(pg->url(), {"conv", "set", w.conv, "--recall-window-ms", "600000"});
    auto a = login(free_srv->port(), ana);
    auto b = login(free_srv->port(), w.users[1]);
    ASSERT_EQ(str(b->request({{"t", "sub"}}), "t"), "subscribed");
    std::vector<std::string> cmids;
    std::vector<std::int64_t> seqs;
    for (int i = 0; i < 4; ++i) {
        cmids.push_back(uuid4());
        auto r = send_msg(*a, w.conv, cmids.back(), "secret " + std::to_string(i));
        ASSERT_EQ(str(r, "t"), "sent") << json::serialize(r);
        seqs.push_back(num(r, "seq"));
    }
    // One recalled by ana herself already, one edited.
    ASSERT_EQ(str(a->request({{"t", "recall"}, {"conv", w.conv}, {"cmid", uuid4()}, {"target", seqs[3]}}), "t"),
              "recalled");
    ASSERT_EQ(str(a->request({{"t", "edit"}, {"conv", w.conv}, {"cmid", uuid4()}, {"target", seqs[0]},
                              {"body", "secret edited"}}), "t"), "edited");
    auto theirs = send_msg(*b, w.conv, uuid4(), "ben's");
    ASSERT_EQ(str(theirs, "t"), "sent");
    ASSERT_EQ(str(a->request({{"t", "react"}, {"conv", w.conv}, {"cmid", uuid4()}, {"target", num(theirs, "seq")},
                              {"emoji", "x"}, {"on", true}}), "t"), "reacted");
    // An API send of ana's, with its key.
    auto [sst, sent] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                            json::serialize(json::object{{"sender", ana.user}, {"cmid", "api-1"}, {"body", "via api"}}));
    ASSERT_EQ(sst, 200) << json::serialize(sent);
    const std::string theirs_rows = count_rows(*pg, "sender_user = " + q(w.users[1].user));
    const std::string ana_rows = count_rows(*pg, "sender_user = " + q(ana.user));
    const std::string head_before = scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(w.conv));

    EXPECT_EQ(call("DELETE", "/v1/users/" + ana.user, "{}").first, 400);  // erase:true is required
    EXPECT_EQ(call("DELETE", "/v1/users/" + ana.user, R"({"erase":false})").first, 400);
    EXPECT_EQ(call("DELETE", "/v1/users/nobody-here", R"({"erase":true})").first, 404);
    auto [st, o] = call("DELETE", "/v1/users/" + ana.user, R"({"erase":true})");
    ASSERT_EQ(st, 200) << json::serialize(o);
    EXPECT_EQ(std::to_string(o.at("events_erased").as_int64()), ana_rows);
    EXPECT_EQ(o.at("recalls").as_int64(), 4); // msgs 0-2 and the API's; seqs[3] was recalled before
    EXPECT_EQ(o.at("memberships_closed").as_int64(), 1);
    EXPECT_GE(o.at("devices_revoked").as_int64(), 1);

    // Devices revoked: ana's connection closes; memberships closed by a leave.
    EXPECT_TRUE(wait_until([&] { return a->closed(); }, 10s));
    EXPECT_EQ(scalar("SELECT count(*) FROM devices WHERE user_id = " + q(ana.user) + " AND revoked_at IS NULL"), "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM membership_periods WHERE user_id = " + q(ana.user) + " AND to_seq IS NULL"),
              "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM events WHERE conv_id = " + q(w.conv) + " AND kind = 'leave' AND subject_user = " +
                     q(ana.user)), "1");
    // Every event of hers kept, without content; nobody else's touched.
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(ana.user)), ana_rows);
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(ana.user) + " AND (NOT erased OR body IS NOT NULL OR emoji IS NOT NULL "
                               "OR client_msg_id IS NOT NULL OR request_hash IS NOT NULL OR attachments IS NOT NULL)"),
              "0");
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(w.users[1].user) + " AND NOT erased AND body IS NOT NULL"), theirs_rows);
    EXPECT_EQ(scalar("SELECT count(*) FROM msg_changes WHERE conv_id = " + q(w.conv) + " AND edit_body IS NOT NULL"), "0");
    EXPECT_EQ(scalar("SELECT coalesce(sum(count), 0) FROM reaction_counts WHERE conv_id = " + q(w.conv)), "0");
    // Seqs gap-free; only the recalls and the leave were appended.
    EXPECT_EQ(scalar("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + q(w.conv)), "0");
    EXPECT_EQ(scalar("SELECT next_seq - 1 FROM conversations WHERE conv_id = " + q(w.conv)),
              std::to_string(std::stoll(head_before) + 5));
    // Tombstones: every request key of hers (msgs, recall, edit, reaction).
    EXPECT_EQ(scalar("SELECT count(*) FROM idem_tombstones WHERE sender_user = " + q(ana.user)), ana_rows);
    for (const auto& cm : cmids)
        EXPECT_EQ(scalar("SELECT count(*) FROM idem_tombstones WHERE sender_user = " + q(ana.user) +
                         " AND client_msg_id = " + q(cm)), "1") << cm;

    // In a member's page: erased, no body, recalled (by the operator).
    auto page = sync_conv(*b, w.conv, 0, 200);
    int erased_seen = 0, erase_recalls = 0;
    for (const auto& e : page.at("events").as_array()) {
        const auto& ev = e.as_object();
        if (!ev.contains("erased")) {
            EXPECT_FALSE(ev.contains("sender") && ev.at("sender").is_string() && str(ev, "sender") == ana.user &&
                         str(ev, "kind") != "leave" && str(ev, "kind") != "join")
                << json::serialize(ev);
            continue;
        }
        EXPECT_TRUE(ev.at("erased").as_bool());
        if (ev.at("sender").is_null()) { // the erase's own recalls: marked, so clients drop the target's body
            EXPECT_EQ(str(ev, "kind"), "recall") << json::serialize(ev);
            ++erase_recalls;
            continue;
        }
        EXPECT_EQ(str(ev, "sender"), ana.user) << json::serialize(ev);
        ++erased_seen;
        EXPECT_FALSE(ev.contains("body")) << json::serialize(ev);
        EXPECT_FALSE(ev.contains("cmid")) << json::serialize(ev);
        if (str(ev, "kind") == "msg") {
            EXPECT_TRUE(ev.contains("recalled")) << json::serialize(ev);
        }
        if (str(ev, "kind") == "reaction") {
            EXPECT_EQ(str(ev, "emoji"), "");
        }
    }
    EXPECT_EQ(std::to_string(erased_seen), ana_rows);
    EXPECT_EQ(erase_recalls, 4) << json::serialize(page);
    // Members that stored her msgs learn by the operator's recalls.
    auto pushed = b->wait_push(
        [&](const json::object& f) {
            return (str(f, "t") == "event" && str(f.at("ev").as_object(), "kind") == "recall" &&
                    f.at("ev").as_object().at("sender").is_null()) ||
                   (str(f, "t") == "hint" && str(f, "conv") == w.conv);
        },
        10s);
    EXPECT_TRUE(pushed) << "the erase's recalls were not pushed";

    // A late resend of one of her keys: ORIGINAL_EXPIRED, nothing written.
    auto [rst, ro] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                          json::serialize(json::object{{"sender", ana.user}, {"cmid", "api-1"}, {"body", "via api"}}));
    EXPECT_EQ(rst, 409) << json::serialize(ro);
    EXPECT_EQ(str(ro, "code"), "ORIGINAL_EXPIRED") << json::serialize(ro);
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(ana.user)), ana_rows);
    // Re-provisioned (a new device), her app's outbox resends: the same.
    const std::string token = admin_ok(pg->url(), {"device", "add", ana.user, unique_name("era-new")});
    auto again = login(free_srv->port(), token);
    auto late = send_msg(*again, w.conv, cmids[1], "secret 1");
    EXPECT_EQ(code_of(late), "ORIGINAL_EXPIRED") << json::serialize(late);
    // A rerun finds nothing left; the CLI wants --yes.
    auto [st2, o2] = call("DELETE", "/v1/users/" + ana.user, R"({"erase":true})");
    ASSERT_EQ(st2, 200);
    EXPECT_EQ(o2.at("events_erased").as_int64(), 0);
    EXPECT_EQ(o2.at("recalls").as_int64(), 0);
    EXPECT_EQ(admin(pg->url(), {"user", "erase", ana.user}).first, 2);
}

TEST_F(Moderation, an_erase_stopped_midway_is_finished_by_a_rerun) {
    auto w = make_world(pg->url(), "erx", 2);
    const auto& ana = w.users[0];
    for (int i = 0; i < 1203; ++i) {
        auto [st, o] = call("POST", "/v1/conversations/" + w.conv + "/messages",
                            json::serialize(json::object{{"sender", w.users[i % 7 == 0 ? 1 : 0].user},
                                                         {"cmid", "m" + std::to_string(i)}, {"body", "x"}}));
        ASSERT_EQ(st, 200) << json::serialize(o);
    }
    const std::string ana_rows = count_rows(*pg, "sender_user = " + q(ana.user));
    // Each batch slowed before its commit; the CLI killed once a batch committed (a crash midway).
    std::vector<std::string> argv_s{imserver_bin(), "admin", "--db", pg->url(), "--enable-faults", "--fault",
                                    "store.erase_before_commit=delay:400", "user", "erase", ana.user, "--yes"};
    std::vector<char*> argv;
    for (auto& x : argv_s) argv.push_back(x.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    const bool midway = wait_until([&] { return count_rows(*pg, "sender_user = " + q(ana.user) + " AND erased") != "0"; }, 30s);
    ::kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(midway) << "no batch committed";
    const auto erased_then = std::stoll(count_rows(*pg, "sender_user = " + q(ana.user) + " AND erased"));
    EXPECT_GT(erased_then, 0);
    EXPECT_LT(erased_then, std::stoll(ana_rows)) << "the erase was not stopped midway";
    EXPECT_EQ(scalar("SELECT count(*) FROM devices WHERE user_id = " + q(ana.user) + " AND revoked_at IS NULL"), "0");
    auto done = json::parse(admin_ok(pg->url(), {"user", "erase", ana.user, "--yes"})).as_object();
    EXPECT_EQ(done.at("events_erased").as_int64(), std::stoll(ana_rows) - erased_then);
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(ana.user) + " AND NOT erased"), "0");
    EXPECT_EQ(count_rows(*pg, "sender_user = " + q(ana.user) + " AND kind = 'msg'"),
              scalar("SELECT count(*) FROM events e WHERE e.conv_id = " + q(w.conv) + " AND e.kind = 'recall' AND "
                     "e.sender_user IS NULL"));
    EXPECT_EQ(scalar("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + q(w.conv)), "0");
    EXPECT_EQ(scalar("SELECT count(*) FROM idem_tombstones WHERE sender_user = " + q(ana.user)), ana_rows);
}

} // namespace
