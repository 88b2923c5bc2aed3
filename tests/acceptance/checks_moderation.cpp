// Issue 52: 14-rate-limited and the mute and redaction parts of
// 14-mute-redact-erase (registered as 14-mute-redact while a user's erasure
// is not built: docs/acceptance.md).
#include "lab.hpp"

#include <map>
#include <thread>

namespace im::lab {

namespace {

// 14-rate-limited: a gateway of its own with --send-rate 2 --send-burst 3;
// eight drafts pipelined, then each limited one resent with its cmid after
// its retry_ms, as the SDK does. `broken`: the same gateway with the lab's
// rule.send_rate armed (the limit not applied): the control fails at
// "rate-limited".
Verdict rate_limited(Lab& lab, bool broken) {
    std::vector<std::string> flags{"--quiet", "--send-rate", "2", "--send-burst", "3"};
    if (broken) flags.insert(flags.end(), {"--enable-faults", "--fault", "rule.send_rate=skip"});
    Tracked<ServerProcess> gw(lab, lab.db(), flags, unique_name("gw-rate"));
    auto ana = lab.user("ana"), ben = lab.user("ben");
    auto conv = lab.conv("rate", "group", {ana, ben});
    auto a = connect(gw->port(), ana.token);
    constexpr int drafts = 8;
    std::vector<std::string> cmids;
    for (int i = 0; i < drafts; ++i) {
        cmids.push_back(uuid4());
        a->send_json({{"t", "send"}, {"rid", "d" + std::to_string(i)}, {"conv", conv}, {"cmid", cmids.back()},
                      {"body", "draft " + std::to_string(i)}});
    }
    std::map<std::string, json::object> replies;
    while (replies.size() < drafts) {
        auto f = a->next(10s);
        expect(f.has_value(), "reply", "a pipelined send got no reply");
        if (f->contains("rid")) replies[str(*f, "rid")] = *f;
    }
    std::vector<int> limited;
    for (int i = 0; i < drafts; ++i) {
        const auto& r = replies["d" + std::to_string(i)];
        if (outcome(r) == "RATE_LIMITED") {
            expect(r.contains("retry_ms") && num(r, "retry_ms") > 0, "retry-ms", "RATE_LIMITED without retry_ms: " + brief(r));
            expect(lab.rows(conv, ana.user, cmids[i]) == 0, "nothing-written", "a limited send was written");
            limited.push_back(i);
        } else {
            expect(outcome(r) == "sent", "reply", "draft " + std::to_string(i) + ": " + brief(r));
        }
    }
    expect(!limited.empty(), "rate-limited", "8 pipelined sends over --send-burst 3 at 2/s: none RATE_LIMITED");
    int resends = 0;
    for (int i : limited) {
        json::object r;
        for (int attempt = 0; attempt < 40; ++attempt) {
            r = send(*a, conv, cmids[i], "draft " + std::to_string(i));
            ++resends;
            if (outcome(r) != "RATE_LIMITED") break;
            std::this_thread::sleep_for(std::chrono::milliseconds(num(r, "retry_ms")));
        }
        expect(outcome(answered(r, "resend")) == "sent", "lands", "resend after retry_ms: " + brief(r));
    }
    for (int i = 0; i < drafts; ++i)
        expect(lab.rows(conv, ana.user, cmids[i]) == 1, "exactly-once",
               "draft " + std::to_string(i) + ": " + std::to_string(lab.rows(conv, ana.user, cmids[i])) + " rows");
    return passed(std::to_string(limited.size()) + " of 8 pipelined drafts RATE_LIMITED with retry_ms, nothing "
                  "written for them; after " + std::to_string(resends) + " resends every draft landed exactly once");
}

json::object api_call(ServerProcess& gw, const std::string& key, const std::string& method, const std::string& target,
                      const std::string& body, int& status) {
    auto [st, text] = gw.api(method, target, body, key);
    status = st;
    json::error_code ec;
    auto v = json::parse(text, ec);
    return !ec && v.is_object() ? v.as_object() : json::object{};
}

// 14-mute-redact (the mute and redaction parts of 14-mute-redact-erase):
// through the backend API of a gateway of its own (the shared one has no
// API listener) and the lab's shared gateway for the member's requests.
Verdict mute_redact(Lab& lab) {
    Tracked<ServerProcess> gw(lab, lab.db(), std::vector<std::string>{"--quiet", "--api-listen", "127.0.0.1:0"},
                              unique_name("gw-mod"));
    const std::string key = admin_ok(lab.db(), {"apikey", "add", unique_name("lab-mod"), "--scope", "admin"});
    auto ana = lab.user("ana"), ben = lab.user("ben");
    auto conv = lab.conv("mod", "group", {ana, ben});
    auto a = connect(lab.server().port(), ana.token);
    std::vector<std::int64_t> seqs;
    for (int i = 0; i < 3; ++i) {
        auto r = answered(send(*a, conv, uuid4(), "m" + std::to_string(i)), "send");
        expect(outcome(r) == "sent", "reply", brief(r));
        seqs.push_back(num(r, "seq"));
    }
    int st = 0;
    auto m = api_call(*gw, key, "PUT", "/v1/conversations/" + conv + "/mutes/" + ana.user, "{}", st);
    expect(st == 200, "reply", "mute: HTTP " + std::to_string(st));
    const auto head = lab.head(conv);
    const std::string muted_cmid = uuid4();
    auto r = answered(send(*a, conv, muted_cmid, "while muted"), "muted send");
    expect(outcome(r) == "MUTED", "muted", "a muted member's send: " + brief(r));
    expect(lab.head(conv) == head && lab.rows(conv, ana.user, muted_cmid) == 0, "muted-nothing-written",
           "a muted send moved the head");
    api_call(*gw, key, "DELETE", "/v1/conversations/" + conv + "/mutes/" + ana.user, "", st);
    expect(st == 200, "reply", "unmute: HTTP " + std::to_string(st));
    r = answered(send(*a, conv, uuid4(), "after the mute"), "send after unmute");
    expect(outcome(r) == "sent", "unmuted", "after the unmute: " + brief(r));
    seqs.push_back(num(r, "seq"));

    auto one = api_call(*gw, key, "POST", "/v1/conversations/" + conv + "/messages/" + std::to_string(seqs[0]) + "/redact",
                        "", st);
    expect(st == 200, "reply", "redact: HTTP " + std::to_string(st));
    const auto recall_seq = one.at("seq").as_int64();
    expect(lab.sql("SELECT kind || '|' || coalesce(sender_user, 'null') || '|' || target_seq FROM events WHERE conv_id = " +
                   quote(conv) + " AND seq = " + std::to_string(recall_seq)) ==
               "recall|null|" + std::to_string(seqs[0]),
           "operator-recall", "the redaction is no recall by the operator");
    auto all = api_call(*gw, key, "POST", "/v1/users/" + ana.user + "/redact",
                        json::serialize(json::object{{"conv", conv}}), st);
    expect(st == 200, "reply", "redact all: HTTP " + std::to_string(st));
    expect(all.at("redacted").as_int64() == static_cast<std::int64_t>(seqs.size()) - 1, "redact-all-count",
           "redacted " + json::serialize(all) + ", wanted " + std::to_string(seqs.size() - 1));
    expect(lab.sql("SELECT count(*) FROM events e WHERE e.conv_id = " + quote(conv) + " AND e.kind = 'msg' AND NOT EXISTS "
                   "(SELECT 1 FROM events x WHERE x.conv_id = e.conv_id AND x.kind = 'recall' AND x.target_seq = e.seq "
                   "AND x.sender_user IS NULL)") == "0",
           "redact-all", "a msg of the user is not recalled by the operator");
    expect(lab.sql("SELECT max(seq) - count(*) FROM events WHERE conv_id = " + quote(conv)) == "0", "gap-free",
           "seqs not gap-free after the redactions");
    return passed("MUTED with nothing written, writes again once unmuted; one redaction and a redaction of all of the "
                  "user's msgs as recall events with sender null; seqs gap-free");
}

} // namespace

std::vector<Check> moderation_checks() {
    return {
        {"14-rate-limited", [](Lab& lab) { return rate_limited(lab, false); },
         [](Lab& lab) { return rate_limited(lab, true); },
         "its gateway with rule.send_rate=skip: --send-rate not applied", "rate-limited"},
        {"14-mute-redact", mute_redact, breaking("rule.send_mute", mute_redact),
         "gateway rule.send_mute=skip (im_lab_send_send_mute): a muted member's send is appended", "muted"},
    };
}

} // namespace im::lab
