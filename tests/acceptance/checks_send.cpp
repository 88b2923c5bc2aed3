// 04-*: the send contract (C1, C3, C4, limits).
#include "lab.hpp"

#include <optional>

#include <latch>

#include <set>
#include <thread>

namespace im::lab {

namespace {

Verdict normal_history(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-ab", "direct", {a, b}); // join events at seq 1, 2
    expect(lab.head(c) == 2, "setup-head", "setup: head " + std::to_string(lab.head(c)) + ", wanted 2 earlier events");
    auto ws = connect(lab.server().port(), a.token);
    auto cmid = uuid4();
    auto r = answered(send(*ws, c, cmid, "hello"), "send");
    expect(outcome(r) == "sent", "sent", "send -> " + brief(r));
    expect(num(r, "seq") == 3, "seq-3", "wanted seq 3; got " + brief(r));
    expect(!flag(r, "dup"), "dup-false", "wanted dup:false; got " + brief(r));
    auto rows = lab.rows(c, a.user, cmid);
    expect(rows == 1, "one-row", "rows for the key: " + std::to_string(rows));
    auto body = lab.sql("SELECT body FROM events WHERE conv_id = " + quote(c) + " AND seq = 3");
    expect(body == "hello", "stored-body", "stored body '" + body + "'");
    return passed(brief(r) + ", rows 1, head " + std::to_string(lab.head(c)));
}

// A stranger's send: asserts NOT_MEMBER ("not-member") and the head
// unchanged ("head-unchanged"); returns the error's msg.
std::string non_member_error(Lab& lab, std::string* detail) {
    auto a = lab.user("ana"), b = lab.user("ben"), x = lab.user("eve");
    auto c = lab.conv("c-ab", "direct", {a, b});
    auto before = lab.head(c);
    auto ws = connect(lab.server().port(), x.token);
    auto r = answered(send(*ws, c, uuid4(), "let me in"), "stranger's send");
    auto after = lab.head(c);
    if (detail) *detail = "head " + std::to_string(before) + " -> " + std::to_string(after);
    expect(outcome(r) == "NOT_MEMBER", "not-member", "stranger's send -> " + brief(r) + ", wanted NOT_MEMBER");
    expect(after == before, "head-unchanged", "head moved: " + std::to_string(before) + " -> " + std::to_string(after));
    return str(r, "msg");
}

Verdict non_member_rejected(Lab& lab) {
    std::string d;
    auto msg = non_member_error(lab, &d);
    return passed("NOT_MEMBER \"" + msg + "\", " + d + " unchanged");
}

Verdict unknown_conv_same_error(Lab& lab) {
    auto msg1 = non_member_error(lab, nullptr);
    auto x = lab.user("eve");
    auto ws = connect(lab.server().port(), x.token);
    auto ghost = unique_name("never-existed");
    auto r = answered(send(*ws, ghost, uuid4(), "anyone?"), "send to an unknown conv");
    expect(outcome(r) == "NOT_MEMBER", "unknown-not-member", "unknown conv -> " + brief(r));
    expect(str(r, "msg") == msg1, "same-msg",
           "messages differ: unknown \"" + str(r, "msg") + "\" vs non-member \"" + msg1 + "\"");
    auto exists = lab.sql("SELECT count(*) FROM conversations WHERE conv_id = " + quote(ghost));
    expect(exists == "0", "no-conv-row", "a conversation row appeared");
    return passed("NOT_MEMBER \"" + str(r, "msg") + "\" for both");
}

Verdict idempotency_mismatch(Lab& lab) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-ab", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    auto cmid = uuid4();
    auto r1 = answered(send(*ws, c, cmid, "original"), "first send");
    expect(outcome(r1) == "sent", "first-sent", "first send -> " + brief(r1));
    auto r2 = answered(send(*ws, c, cmid, "changed"), "second send");
    expect(outcome(r2) == "IDEMPOTENCY_MISMATCH", "mismatch", "same cmid, other body -> " + brief(r2));
    auto body = lab.sql("SELECT body FROM events WHERE conv_id = " + quote(c) + " AND client_msg_id = " + quote(cmid));
    expect(body == "original", "body-unchanged", "stored body now '" + body + "'");
    expect(lab.rows(c, a.user, cmid) == 1, "one-row", "rows for the key != 1");
    return passed("IDEMPOTENCY_MISMATCH, stored body 'original', rows 1");
}

struct Replay {
    std::int64_t rows = 0, mids = 0, fresh = 0, replies = 0;
    std::set<std::int64_t> seqs;
    std::vector<std::string> odd;
};

// Shared by 04-concurrent-replay-one-row and its negative control. The
// connections are dealt round-robin over the gateways' ports.
Replay concurrent_replay(Lab& lab, const std::vector<unsigned short>& ports, const std::string& db_url,
                         const std::string& database, int n) {
    std::string u1 = unique_name("ana"), u2 = unique_name("ben");
    auto a = make_user(db_url, u1);
    auto b = make_user(db_url, u2);
    std::string c = unique_name("c-burst");
    admin_ok(db_url, {"conv", "create", c, "--kind", "direct", "--members", u1 + "," + u2});
    std::string install = uuid4(), cmid = uuid4();
    std::vector<std::unique_ptr<WsClient>> conns;
    for (int i = 0; i < n; ++i) conns.push_back(connect(ports[static_cast<std::size_t>(i) % ports.size()], a.token, install));
    // Every thread is ready before any sends (a latch), so the 32 frames
    // leave at once and the sends overlap on the server.
    std::vector<std::thread> threads;
    std::vector<json::object> replies(n);
    std::latch ready(n + 1);
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            ready.arrive_and_wait();
            replies[i] = send(*conns[i], c, cmid, "burst", 30s);
        });
    ready.arrive_and_wait();
    for (auto& t : threads) t.join();
    Replay r;
    std::set<std::string> mids;
    for (auto& rep : replies) {
        if (outcome(rep) != "sent") {
            r.odd.push_back(brief(rep));
            continue;
        }
        ++r.replies;
        mids.insert(str(rep, "mid"));
        r.seqs.insert(num(rep, "seq"));
        if (!flag(rep, "dup")) ++r.fresh;
    }
    r.rows = lab.rows(c, a.user, cmid, database);
    r.mids = std::stoll(lab.sql("SELECT count(DISTINCT mid) FROM events WHERE conv_id = " + quote(c) +
                                    " AND client_msg_id = " + quote(cmid),
                                database));
    return r;
}

Verdict judge_replay(const Replay& r) {
    std::string d = "rows " + std::to_string(r.rows) + ", mids " + std::to_string(r.mids) + ", dup:false x" +
                    std::to_string(r.fresh) + ", " + std::to_string(r.replies) + "/32 sent, seqs " +
                    std::to_string(r.seqs.size());
    expect(r.odd.empty(), "all-sent", d + "; unexpected replies: " + (r.odd.empty() ? "" : r.odd.front()));
    expect(r.rows == 1, "one-row", d);
    expect(r.mids == 1, "one-mid", d);
    expect(r.fresh == 1, "one-fresh", d);
    expect(r.replies == 32 && r.seqs.size() == 1, "one-seq", d);
    return passed(d);
}

// Two gateways: one gateway queues a conversation's runs behind the one
// its send worker holds (SendCombiner), so only sends through different
// gateways meet in the database at once, where C1 must hold them.
Verdict concurrent_replay_one_row(Lab& lab) {
    Tracked<ServerProcess> other(lab, lab.db(), std::vector<std::string>{"--quiet"}, unique_name("gw-replay"));
    return judge_replay(concurrent_replay(lab, {lab.server().port(), other->port()}, lab.db(), "im", 32));
}

// The bursts against a database without events_idempotency, run once per
// lab run: by the control of 04-concurrent-replay-one-row, whose last burst
// 04-control-no-unique-index then reports (it runs them itself only when it
// runs alone, e.g. `im_acceptance 04-control`).
struct NoIndexBursts {
    Replay last;    // the first burst that showed duplicates, else the fifth
    int rounds = 0;
    std::string index_rows; // events_idempotency rows in that database
};
std::optional<NoIndexBursts> no_index_bursts;

// --lab-no-unique-index: check-then-insert without the index and without the
// row lock, and one conversation's sends in up to 8 send workers at once.
// The defect is a race, so up to 5 bursts of 32.
const NoIndexBursts& bursts_without_index(Lab& lab) {
    if (no_index_bursts) return *no_index_bursts;
    const std::string name = "lab_nouniq";
    auto url = lab.pg().create_database(name);
    Tracked<ServerProcess> srv(lab, url,
                               std::vector<std::string>{"--enable-faults", "--lab-no-unique-index", "--quiet",
                                                        "--db-pool", "8", "--send-workers", "8"},
                               unique_name("gw-nouniq"));
    NoIndexBursts b;
    b.index_rows = lab.sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'events_idempotency'", name);
    for (b.rounds = 1; b.rounds <= 5; ++b.rounds) {
        b.last = concurrent_replay(lab, {srv->port()}, url, name, 32);
        if (b.last.rows > 1) break;
    }
    b.rounds = std::min(b.rounds, 5);
    no_index_bursts = b;
    return *no_index_bursts;
}

// The check's negative control: the check's judgement of those bursts.
Verdict concurrent_replay_without_index(Lab& lab) {
    const auto& b = bursts_without_index(lab);
    try {
        return judge_replay(b.last);
    } catch (const CheckFailed& e) {
        return failed(e.tag, std::string(e.what()) + " (burst " + std::to_string(b.rounds) + ")");
    }
}

// The spec's own control id: the same bursts (not run a second time).
Verdict control_no_unique_index(Lab& lab) {
    const auto& b = bursts_without_index(lab);
    const Replay& r = b.last;
    std::string d = "events_idempotency present: " + b.index_rows + ", rows " + std::to_string(r.rows) + ", mids " +
                    std::to_string(r.mids) + ", dup:false x" + std::to_string(r.fresh);
    expect(r.rows > 1, "duplicates", "control did not show the defect after 5 bursts: " + d);
    return passed("duplicates appeared: " + d + " (burst " + std::to_string(b.rounds) +
                  ", the bursts of 04-concurrent-replay-one-row's control)");
}

// at_edge: the negative control's client double, an off-by-one client that
// sends each over-limit value at its edge instead (cmid 1/64 chars, body
// 1/4000 code points, limit 1, after 0, a frame just under 64 KiB), so a
// server that accepted them would look the same to the check.
Verdict limits(Lab& lab, bool at_edge) {
    auto a = lab.user("ana"), b = lab.user("ben");
    auto c = lab.conv("c-lim", "direct", {a, b});
    auto ws = connect(lab.server().port(), a.token);
    auto want = [&](const char* tag, const char* what, const json::object& r, const std::string& code) {
        answered(r, what);
        expect(outcome(r) == code, tag, std::string(what) + " -> " + brief(r) + ", wanted " + code);
    };
    std::string e4000, e4001;
    for (int i = 0; i < 4000; ++i) e4000 += "\xC3\xA9"; // U+00E9, 2 bytes: code points, not bytes
    e4001 = e4000 + "\xC3\xA9";
    const auto head0 = lab.head(c);
    want("cmid-0", "cmid 0", send(*ws, c, at_edge ? "k" : "", "x"), "INVALID_ARGUMENT");
    want("cmid-65", "cmid 65", send(*ws, c, std::string(at_edge ? 64 : 65, 'q'), "x"), "INVALID_ARGUMENT");
    want("body-0", "body 0", send(*ws, c, uuid4(), at_edge ? "x" : ""), "INVALID_ARGUMENT");
    want("body-4001", "body 4001", send(*ws, c, uuid4(), at_edge ? e4000 : e4001), "INVALID_ARGUMENT");
    want("limit-0", "limit 0", sync(*ws, c, 0, at_edge ? 1 : 0), "INVALID_ARGUMENT");
    want("after-minus-1", "after -1", sync(*ws, c, at_edge ? 0 : -1, 10), "INVALID_ARGUMENT");
    expect(lab.head(c) == head0, "no-event", "a rejected send wrote an event");
    // The edges themselves are accepted.
    want("cmid-64", "cmid 64", send(*ws, c, std::string(64, 'k'), "x"), "sent");
    want("body-4000", "body 4000", send(*ws, c, uuid4(), e4000), "sent");
    // A frame over 64 KiB closes the connection with 1009.
    auto big = connect(lab.server().port(), a.token);
    std::string pad((at_edge ? 63 : 65) * 1024, 'p');
    big->send_text("{\"t\":\"send\",\"conv\":\"" + c + "\",\"cmid\":\"" + uuid4() + "\",\"body\":\"" + pad + "\"}");
    int code = big->wait_closed(10s);
    expect(code == 1009, "close-1009", "65 KiB frame: close code " + std::to_string(code) + ", wanted 1009");
    // The server is still fine.
    auto again = send(*ws, c, uuid4(), "still here");
    answered(again, "send after the big frame");
    expect(outcome(again) == "sent", "still-serving", "after the big frame: " + brief(again));
    return passed("INVALID_ARGUMENT for cmid 0/65, body 0/4001 cp, limit 0, after -1; cmid 64 and body 4000 cp "
                  "accepted; 65 KiB frame closed 1009");
}

} // namespace

std::vector<Check> send_checks() {
    return {
        {"04-normal-history", normal_history, breaking("rule.fresh_dup", normal_history),
         "gateway rule.fresh_dup=skip: a fresh append is answered dup:true", "dup-false"},
        {"04-non-member-rejected", non_member_rejected, breaking("rule.send_membership", non_member_rejected),
         "gateway rule.send_membership=skip: im_send appends a stranger's send", "not-member"},
        {"04-unknown-conv-same-error", unknown_conv_same_error, breaking("rule.same_error", unknown_conv_same_error),
         "gateway rule.same_error=skip: an unknown conversation answers UNAUTHENTICATED", "unknown-not-member"},
        {"04-idempotency-mismatch", idempotency_mismatch, breaking("rule.request_hash", idempotency_mismatch),
         "gateway rule.request_hash=skip: a reused cmid is a duplicate whatever its body", "mismatch"},
        {"04-concurrent-replay-one-row", concurrent_replay_one_row, concurrent_replay_without_index,
         "imserver --lab-no-unique-index (no events_idempotency, no row lock)", "one-row"},
        {"04-control-no-unique-index", control_no_unique_index},
        {"04-limits", [](Lab& l) { return limits(l, false); }, [](Lab& l) { return limits(l, true); },
         "client double: each over-limit value is sent at its edge (cmid 1/64, body 1/4000 cp, limit 1, after 0, "
         "a 63 KiB frame)", "cmid-0",
         {{breaking("rule.limits", [](Lab& l) { return limits(l, false); }),
           "gateway rule.limits=skip: the codec's field bounds (cmid, body, limit, after) are not checked", "cmid-0"}}},
    };
}

} // namespace im::lab
