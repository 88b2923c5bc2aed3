// The wire codec, driven by tables of frames: every limit of contract
// section 9 at its edge and just past it. No sockets, no database.
#include "core/protocol.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

using namespace im;

namespace {

std::string rep(std::size_t n, const std::string& unit = "a") {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) s += unit;
    return s;
}

struct Case {
    const char* name;
    std::string frame;
    const char* expect; // request type name, or an error code
};

std::string send_frame(const std::string& cmid, const std::string& body) {
    return R"({"t":"send","rid":"x","conv":"c1","cmid":")" + cmid + R"(","body":")" + body + R"("})";
}

// n distinct att_ids, quoted and joined by ','.
std::string att_list(std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
        char id[64];
        std::snprintf(id, sizeof id, "00000000-0000-4000-8000-%012zu", i);
        out += (i ? ",\"" : "\"") + std::string(id) + "\"";
    }
    return out;
}

class CodecTable : public ::testing::TestWithParam<Case> {};

TEST_P(CodecTable, frame_gets_the_expected_outcome) {
    const Case& c = GetParam();
    Parsed p = parse_request(c.frame);
    if (auto* e = std::get_if<Error>(&p.body)) {
        EXPECT_EQ(code_name(e->code), c.expect) << c.name << ": " << e->msg;
    } else {
        EXPECT_EQ(request_name(std::get<Request>(p.body)), c.expect) << c.name;
    }
}

const std::string euro = "\xE2\x82\xAC"; // 3 bytes, 1 code point

INSTANTIATE_TEST_SUITE_P(
    Limits, CodecTable,
    ::testing::Values(
        Case{"cmid_1_char_ok", send_frame("a", "hi"), "send"},
        Case{"cmid_64_chars_ok", send_frame(rep(64), "hi"), "send"},
        Case{"cmid_0_chars", send_frame("", "hi"), "INVALID_ARGUMENT"},
        Case{"cmid_65_chars", send_frame(rep(65), "hi"), "INVALID_ARGUMENT"},
        Case{"body_1_cp_ok", send_frame("a", "x"), "send"},
        Case{"body_0_cp", send_frame("a", ""), "INVALID_ARGUMENT"},
        Case{"body_4000_cp_ok", send_frame("a", rep(4000)), "send"},
        Case{"body_4001_cp", send_frame("a", rep(4001)), "INVALID_ARGUMENT"},
        Case{"body_4000_multibyte_cp_ok", send_frame("a", rep(4000, euro)), "send"},
        Case{"body_4001_multibyte_cp", send_frame("a", rep(4001, euro)), "INVALID_ARGUMENT"},
        Case{"body_nul", R"({"t":"send","conv":"c","cmid":"a","body":"a\u0000b"})", "INVALID_ARGUMENT"},
        Case{"body_not_string", R"({"t":"send","conv":"c","cmid":"a","body":5})", "INVALID_ARGUMENT"},
        Case{"body_missing", R"({"t":"send","conv":"c","cmid":"a"})", "INVALID_ARGUMENT"},
        Case{"conv_bad_chars", R"({"t":"send","conv":"a b","cmid":"a","body":"x"})", "INVALID_ARGUMENT"},
        Case{"conv_65_chars", R"({"t":"send","conv":")" + rep(65) + R"(","cmid":"a","body":"x"})", "INVALID_ARGUMENT"},
        Case{"conv_64_chars_ok", R"({"t":"send","conv":")" + rep(64) + R"(","cmid":"a","body":"x"})", "send"},
        Case{"sync_limit_1_ok", R"({"t":"sync","conv":"c","after":0,"limit":1})", "sync"},
        Case{"sync_limit_0", R"({"t":"sync","conv":"c","after":0,"limit":0})", "INVALID_ARGUMENT"},
        Case{"sync_limit_huge_ok", R"({"t":"sync","conv":"c","after":0,"limit":100000})", "sync"},
        Case{"sync_after_0_ok", R"({"t":"sync","conv":"c","after":0})", "sync"},
        Case{"sync_after_neg", R"({"t":"sync","conv":"c","after":-1})", "INVALID_ARGUMENT"},
        Case{"sync_after_float", R"({"t":"sync","conv":"c","after":1.5})", "INVALID_ARGUMENT"},
        Case{"sync_after_string", R"({"t":"sync","conv":"c","after":"1"})", "INVALID_ARGUMENT"},
        Case{"sync_after_huge", R"({"t":"sync","conv":"c","after":18446744073709551615})", "INVALID_ARGUMENT"},
        // No bound on epoch, fetch.seq or recall.target (contract section 9):
        // the store answers EPOCH_CHANGED / NOT_FOUND (contract_test).
        Case{"sync_epoch_0_parses", R"({"t":"sync","conv":"c","after":0,"epoch":0})", "sync"},
        Case{"history_epoch_neg_parses", R"({"t":"history","conv":"c","before":0,"epoch":-1})", "history"},
        Case{"sync_epoch_string", R"({"t":"sync","conv":"c","after":0,"epoch":"1"})", "INVALID_ARGUMENT"},
        Case{"rid_64_ok", R"({"t":"convs","rid":")" + rep(64) + R"("})", "convs"},
        Case{"rid_65", R"({"t":"convs","rid":")" + rep(65) + R"("})", "INVALID_ARGUMENT"},
        Case{"rid_number", R"({"t":"convs","rid":7})", "INVALID_ARGUMENT"},
        // 64 characters, not bytes (contract section 9): 192 bytes of 3-byte characters pass.
        Case{"rid_64_multibyte_chars_ok", R"({"t":"convs","rid":")" + rep(64, euro) + R"("})", "convs"},
        Case{"rid_65_multibyte_chars", R"({"t":"convs","rid":")" + rep(65, euro) + R"("})", "INVALID_ARGUMENT"},
        Case{"not_json", "hello", "INVALID_ARGUMENT"},
        Case{"json_array", "[1,2]", "INVALID_ARGUMENT"},
        Case{"no_t", R"({"conv":"c"})", "INVALID_ARGUMENT"},
        Case{"t_number", R"({"t":1})", "INVALID_ARGUMENT"},
        Case{"unknown_t", R"({"t":"explode"})", "INVALID_ARGUMENT"},
        Case{"invalid_utf8", "{\"t\":\"send\",\"conv\":\"c\",\"cmid\":\"a\",\"body\":\"\xC3\x28\"}", "INVALID_ARGUMENT"},
        // contract section 12: reply_to, edit, react
        Case{"send_reply_to_ok", R"({"t":"send","conv":"c","cmid":"a","body":"x","reply_to":3})", "send"},
        Case{"send_reply_to_string", R"({"t":"send","conv":"c","cmid":"a","body":"x","reply_to":"3"})", "INVALID_ARGUMENT"},
        Case{"send_reply_to_float", R"({"t":"send","conv":"c","cmid":"a","body":"x","reply_to":1.5})", "INVALID_ARGUMENT"},
        // contract section 12: attachments, 1-10 distinct att_ids; body 0-4000 with them
        Case{"send_attachments_ok", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":["0f8fad5b-d9cb-469f-a165-70867728950e","7c9e6679-7425-40de-944b-e07fc1f90ae7"]})", "send"},
        Case{"send_attachments_empty_body_ok", R"({"t":"send","conv":"c","cmid":"a","body":"","attachments":["0f8fad5b-d9cb-469f-a165-70867728950e"]})", "send"},
        Case{"send_no_attachments_empty_body", R"({"t":"send","conv":"c","cmid":"a","body":""})", "INVALID_ARGUMENT"},
        Case{"send_attachments_body_4001_cp", R"({"t":"send","conv":"c","cmid":"a","body":")" + rep(4001) + R"(","attachments":["0f8fad5b-d9cb-469f-a165-70867728950e"]})", "INVALID_ARGUMENT"},
        Case{"send_attachments_10_ok", R"({"t":"send","conv":"c","cmid":"a","body":"","attachments":[)" + att_list(10) + "]}", "send"},
        Case{"send_attachments_11", R"({"t":"send","conv":"c","cmid":"a","body":"","attachments":[)" + att_list(11) + "]}", "INVALID_ARGUMENT"},
        Case{"send_attachments_empty_list", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":[]})", "INVALID_ARGUMENT"},
        Case{"send_attachments_not_a_list", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":"0f8fad5b-d9cb-469f-a165-70867728950e"})", "INVALID_ARGUMENT"},
        Case{"send_attachments_repeated", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":["0f8fad5b-d9cb-469f-a165-70867728950e","0f8fad5b-d9cb-469f-a165-70867728950e"]})", "INVALID_ARGUMENT"},
        Case{"send_attachments_uppercase", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":["0F8FAD5B-D9CB-469F-A165-70867728950E"]})", "INVALID_ARGUMENT"},
        Case{"send_attachments_not_uuid", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":["0f8fad5b-d9cb-469f-a165-70867728950"]})", "INVALID_ARGUMENT"},
        Case{"send_attachments_number", R"({"t":"send","conv":"c","cmid":"a","body":"x","attachments":[5]})", "INVALID_ARGUMENT"},
        Case{"edit_ok", R"({"t":"edit","conv":"c","target":3,"cmid":"e","body":"fixed"})", "edit"},
        // Empty passes the codec: the store allows it only for a target with attachments.
        Case{"edit_body_0_cp", R"({"t":"edit","conv":"c","target":3,"cmid":"e","body":""})", "edit"},
        Case{"edit_no_target", R"({"t":"edit","conv":"c","cmid":"e","body":"x"})", "INVALID_ARGUMENT"},
        Case{"edit_body_4001_cp", R"({"t":"edit","conv":"c","target":3,"cmid":"e","body":")" + rep(4001) + R"("})", "INVALID_ARGUMENT"},
        Case{"react_ok", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"\ud83d\udc4d","on":true})", "react"},
        Case{"react_off_ok", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"x","on":false})", "react"},
        Case{"react_emoji_64_bytes_ok", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":")" + rep(16, "\xF0\x9F\x91\x8D") + R"(","on":true})", "react"},
        Case{"react_emoji_65_bytes", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":")" + rep(65) + R"(","on":true})", "INVALID_ARGUMENT"},
        Case{"react_emoji_empty", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"","on":true})", "INVALID_ARGUMENT"},
        Case{"react_emoji_control", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"a\tb","on":true})", "INVALID_ARGUMENT"},
        Case{"react_emoji_c1_control", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"\u0085","on":true})", "INVALID_ARGUMENT"},
        Case{"react_on_number", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"x","on":1})", "INVALID_ARGUMENT"},
        Case{"react_on_missing", R"({"t":"react","conv":"c","target":3,"cmid":"r","emoji":"x"})", "INVALID_ARGUMENT"},
        Case{"hello_ok", R"({"t":"hello","token":"abc","install":"i-1"})", "hello"},
        Case{"hello_no_install", R"({"t":"hello","token":"abc"})", "INVALID_ARGUMENT"},
        Case{"hello_jwt_4096_chars_ok", R"({"t":"hello","token":")" + rep(4096) + R"(","install":"i-1"})", "hello"},
        // A bad credential, not a malformed request: parsed, then refused
        // UNAUTHENTICATED (contract_test).
        Case{"hello_token_empty_parses", R"({"t":"hello","token":"","install":"i-1"})", "hello"},
        Case{"hello_token_4097_chars_parses", R"({"t":"hello","token":")" + rep(4097) + R"(","install":"i-1"})", "hello"},
        Case{"refresh_ok", R"({"t":"refresh","rid":"r1","token":"aaa.bbb.ccc"})", "refresh"},
        Case{"refresh_no_token", R"({"t":"refresh","rid":"r1"})", "INVALID_ARGUMENT"},
        Case{"refresh_token_empty_parses", R"({"t":"refresh","token":""})", "refresh"},
        Case{"refresh_token_number", R"({"t":"refresh","token":5})", "INVALID_ARGUMENT"},
        Case{"refresh_token_4097_chars_parses", R"({"t":"refresh","token":")" + rep(4097) + R"("})", "refresh"},
        Case{"ack_seq_neg", R"({"t":"ack","conv":"c","seq":-1})", "INVALID_ARGUMENT"},
        Case{"fetch_seq_0_parses", R"({"t":"fetch","conv":"c","seq":0})", "fetch"},
        Case{"recall_target_0_parses", R"({"t":"recall","conv":"c","target":0,"cmid":"k"})", "recall"},
        Case{"recall_ok", R"({"t":"recall","conv":"c","target":3,"cmid":"k"})", "recall"},
        Case{"recall_no_cmid", R"({"t":"recall","conv":"c","target":3})", "INVALID_ARGUMENT"}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Contract section 13: typing and presence.
std::string users_frame(std::size_t n, std::size_t chars = 3) {
    std::string f = R"({"t":"presence","users":[)";
    for (std::size_t i = 0; i < n; ++i) {
        std::string id = std::to_string(i);
        f += (i ? ",\"" : "\"") + rep(chars > id.size() ? chars - id.size() : 0, "u") + id + "\"";
    }
    return f + "]}";
}

INSTANTIATE_TEST_SUITE_P(
    Ephemeral, CodecTable,
    ::testing::Values(
        Case{"typing_on_ok", R"({"t":"typing","conv":"c","on":true})", "typing"},
        Case{"typing_off_ok", R"({"t":"typing","conv":"c","on":false})", "typing"},
        Case{"typing_no_on", R"({"t":"typing","conv":"c"})", "INVALID_ARGUMENT"},
        Case{"typing_on_number", R"({"t":"typing","conv":"c","on":1})", "INVALID_ARGUMENT"},
        Case{"typing_on_string", R"({"t":"typing","conv":"c","on":"true"})", "INVALID_ARGUMENT"},
        Case{"typing_no_conv", R"({"t":"typing","on":true})", "INVALID_ARGUMENT"},
        Case{"typing_bad_conv", R"({"t":"typing","conv":"a b","on":true})", "INVALID_ARGUMENT"},
        Case{"presence_1_ok", users_frame(1), "presence"},
        Case{"presence_500_ok", users_frame(500), "presence"},
        Case{"presence_0", users_frame(0), "INVALID_ARGUMENT"},
        Case{"presence_501", users_frame(501), "INVALID_ARGUMENT"},
        Case{"presence_no_users", R"({"t":"presence"})", "INVALID_ARGUMENT"},
        Case{"presence_users_string", R"({"t":"presence","users":"ana"})", "INVALID_ARGUMENT"},
        Case{"presence_users_number", R"({"t":"presence","users":[1]})", "INVALID_ARGUMENT"},
        Case{"presence_users_bad_id", R"({"t":"presence","users":["a b"]})", "INVALID_ARGUMENT"},
        Case{"presence_users_65_chars", R"({"t":"presence","users":[")" + rep(65) + R"("]})", "INVALID_ARGUMENT"}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(Codec, presence_dedupes_its_users_and_its_largest_answer_fits_a_frame) {
    Parsed p = parse_request(R"({"t":"presence","users":["ben","ana","ben"]})");
    const auto& r = std::get<req::Presence>(std::get<Request>(p.body));
    EXPECT_EQ(r.users, (std::vector<std::string>{"ana", "ben"}));
    // 500 ids of 64 characters, online, with a rid of 64 escaped characters.
    PresenceList all;
    for (int i = 0; i < 500; ++i) {
        std::string id = std::to_string(i);
        all.users.push_back({rep(64 - id.size()) + id, true, 1765080000123});
    }
    EXPECT_LE(encode_reply(all, rep(64, "\"")).size(), max_frame_bytes);
    EXPECT_EQ(encode_reply(PresenceList{{{"ana", false, std::nullopt}}}, std::nullopt),
              R"({"t":"presence","users":[{"user":"ana","online":false,"last_seen":null}]})");
    EXPECT_EQ(encode_reply(TypingOk{}, std::string("r")), R"({"t":"typing_ok","rid":"r"})");
    EXPECT_EQ(encode_typing_push("c", "ana", true), R"({"t":"typing","conv":"c","user":"ana","on":true})");
    EXPECT_EQ(encode_presence_push({"ben", false, 5}), R"({"t":"presence","user":"ben","online":false,"last_seen":5})");
}

TEST(Codec, error_reply_echoes_a_readable_rid) {
    Parsed p = parse_request(R"({"t":"sync","rid":"q7","conv":"c","after":-1})");
    ASSERT_TRUE(std::holds_alternative<Error>(p.body));
    ASSERT_TRUE(p.rid.has_value());
    EXPECT_EQ(*p.rid, "q7");
    std::string out = encode_error(std::get<Error>(p.body), p.rid);
    EXPECT_NE(out.find("\"rid\":\"q7\""), std::string::npos);
    EXPECT_NE(out.find("\"code\":\"INVALID_ARGUMENT\""), std::string::npos);
}

TEST(Codec, refresh_carries_its_token_and_refreshed_its_exp) {
    Parsed p = parse_request(R"({"t":"refresh","rid":"r9","token":"h.p.s"})");
    EXPECT_EQ(std::get<req::Refresh>(std::get<Request>(p.body)).token, "h.p.s");
    EXPECT_EQ(p.type, "refresh");
    EXPECT_EQ(encode_reply(Refreshed{1732870060000}, p.rid), R"({"t":"refreshed","exp":1732870060000,"rid":"r9"})");
    EXPECT_EQ(encode_token_expiring(1732870060000), R"({"t":"token_expiring","exp":1732870060000})");
}

// Issue 24, item 7: an unknown `t` was echoed whole, so a frame just under
// the 64 KiB limit made an error reply (a server frame) past it.
TEST(Codec, an_unknown_type_is_not_echoed_whole_and_the_reply_stays_within_the_frame_limit) {
    const std::string rid = rep(64);
    const std::string frame = R"({"t":")" + rep(max_frame_bytes - 300) + R"(","rid":")" + rid + R"("})";
    ASSERT_LE(frame.size(), max_frame_bytes);
    Parsed p = parse_request(frame);
    ASSERT_TRUE(std::holds_alternative<Error>(p.body));
    const std::string out = encode_error(std::get<Error>(p.body), p.rid);
    EXPECT_LE(out.size(), 1024u) << "the reply echoes the unknown type";
    EXPECT_NE(out.find("\"rid\":\"" + rid + "\""), std::string::npos);
    // A short unknown type is still named.
    Parsed q = parse_request(R"({"t":"explode"})");
    EXPECT_NE(std::get<Error>(q.body).msg.find("'explode'"), std::string::npos);
}

TEST(Codec, limit_above_200_is_cut_to_200) {
    Parsed p = parse_request(R"({"t":"sync","conv":"c","after":0,"limit":201})");
    auto& r = std::get<req::Sync>(std::get<Request>(p.body));
    EXPECT_EQ(r.limit, 200);
}

TEST(Codec, only_unavailable_is_retryable) {
    for (int c = 0; c <= static_cast<int>(Code::unavailable); ++c) {
        auto code = static_cast<Code>(c);
        EXPECT_EQ(is_retryable(code), code == Code::unavailable) << code_name(code);
    }
}

TEST(Codec, event_encoding_carries_kind_specific_fields) {
    Event ev;
    ev.conv = "c";
    ev.seq = 4;
    ev.mid = "m";
    ev.kind = "recall";
    ev.sender = "ana";
    ev.target = 3;
    ev.ts = 5;
    ev.epoch = 2;
    std::string out = encode_event_push(ev);
    EXPECT_NE(out.find("\"target\":3"), std::string::npos);
    EXPECT_EQ(out.find("\"body\""), std::string::npos);
    EXPECT_NE(out.find("\"epoch\":2"), std::string::npos);
}

// Contract section 12: a msg carries its attachments in the order sent, the
// store's JSON list read back as written; a send keeps the ids in its order.
TEST(Codec, a_msg_carries_its_attachments_in_order_and_a_send_keeps_the_ids_given) {
    Event ev;
    ev.conv = "c";
    ev.seq = 4;
    ev.kind = "msg";
    ev.body = "";
    ev.attachments = attachments_from_json(
        R"([{"att_id":"b","name":"z.png","mime":"image/png","size":7,"sha256":"ff"},)"
        R"({"att_id":"a","name":"a.txt","mime":"text/plain","size":0,"sha256":"00"}])");
    ASSERT_EQ(ev.attachments.size(), 2u);
    const std::string out = encode_event_push(ev);
    const auto b = out.find(R"({"att_id":"b","name":"z.png","mime":"image/png","size":7,"sha256":"ff"})");
    const auto a = out.find(R"({"att_id":"a","name":"a.txt","mime":"text/plain","size":0,"sha256":"00"})");
    EXPECT_NE(b, std::string::npos) << out;
    EXPECT_NE(a, std::string::npos) << out;
    EXPECT_LT(b, a);
    ev.attachments.clear();
    EXPECT_EQ(encode_event_push(ev).find("attachments"), std::string::npos); // absent when none
    EXPECT_TRUE(attachments_from_json("").empty());
    EXPECT_TRUE(attachments_from_json("not json").empty());

    auto p = parse_request(R"({"t":"send","conv":"c","cmid":"k","body":"","attachments":)"
                           R"(["7c9e6679-7425-40de-944b-e07fc1f90ae7","0f8fad5b-d9cb-469f-a165-70867728950e"]})");
    ASSERT_TRUE(std::holds_alternative<Request>(p.body));
    const auto& send = std::get<req::Send>(std::get<Request>(p.body));
    ASSERT_EQ(send.attachments.size(), 2u);
    EXPECT_EQ(send.attachments[0], "7c9e6679-7425-40de-944b-e07fc1f90ae7");
    EXPECT_EQ(send.attachments[1], "0f8fad5b-d9cb-469f-a165-70867728950e");
}


// ---- the event encoding is the one Boost.JSON's trees gave ----------------
// protocol.cpp writes events and the frames that carry them straight into
// the text (no json::object per event, docs/benchmarks.md, "The heavy
// page, taken apart"); the wire must not change by a byte. The reference
// below is the encoder it replaced, kept verbatim.
namespace old_encoding {
namespace json = boost::json;

json::object event_json(const Event& ev) {
    json::object o;
    o["conv"] = ev.conv;
    o["seq"] = ev.seq;
    o["mid"] = ev.mid;
    o["kind"] = ev.kind;
    if (ev.sender.empty()) o["sender"] = nullptr;
    else o["sender"] = ev.sender;
    if (ev.body) o["body"] = *ev.body;
    if (ev.target) o["target"] = *ev.target;
    if (ev.reply_to) o["reply_to"] = *ev.reply_to;
    if (!ev.attachments.empty()) {
        json::array a;
        for (const auto& x : ev.attachments)
            a.push_back(json::object{{"att_id", x.att_id}, {"name", x.name}, {"mime", x.mime}, {"size", x.size},
                                     {"sha256", x.sha256}});
        o["attachments"] = std::move(a);
    }
    if (ev.emoji) o["emoji"] = *ev.emoji;
    if (ev.on) o["on"] = *ev.on;
    if (ev.erased) {
        o["erased"] = true;
        if (ev.kind == "reaction") {
            o["emoji"] = "";
            o["on"] = false;
        }
    }
    if (ev.edit) o["edit"] = json::object{{"seq", ev.edit->seq}, {"body", ev.edit->body}, {"ts", ev.edit->ts}};
    if (!ev.reactions.empty()) {
        json::array a;
        for (const auto& r : ev.reactions) a.push_back(json::object{{"emoji", r.emoji}, {"count", r.count}, {"me", r.me}});
        o["reactions"] = std::move(a);
    }
    if (ev.reactions_seq) o["reactions_seq"] = *ev.reactions_seq;
    if (ev.recalled) o["recalled"] = true;
    if (ev.user) o["user"] = *ev.user;
    if (ev.cmid) o["cmid"] = *ev.cmid;
    o["ts"] = ev.ts;
    o["epoch"] = ev.epoch;
    return o;
}

std::string finish(json::object o, const std::optional<std::string>& rid) {
    if (rid) o["rid"] = *rid;
    return json::serialize(o);
}

json::array events_json(const std::vector<Event>& evs) {
    json::array a;
    for (const auto& ev : evs) a.push_back(event_json(ev));
    return a;
}

std::string page(const Page& x, const std::optional<std::string>& rid) {
    json::object o;
    o["t"] = "page"; o["conv"] = x.conv;
    o["events"] = events_json(x.events);
    o["next_after"] = x.next_after; o["has_more"] = x.has_more; o["head"] = x.head;
    o["min_seq"] = x.min_seq; o["trimmed"] = x.trimmed; o["epoch"] = x.epoch;
    return finish(std::move(o), rid);
}

std::string history(const HistoryPage& x, const std::optional<std::string>& rid) {
    json::object o;
    o["t"] = "page"; o["conv"] = x.conv;
    o["events"] = events_json(x.events);
    o["oldest"] = x.oldest; o["has_older"] = x.has_older; o["head"] = x.head;
    o["min_seq"] = x.min_seq; o["trimmed"] = x.trimmed; o["epoch"] = x.epoch;
    return finish(std::move(o), rid);
}
} // namespace old_encoding

// Every kind and optional field, and strings holding every byte value
// (escapes, quotes, backslashes, UTF-8, bytes that are not UTF-8).
std::vector<Event> encoding_table() {
    std::string every_byte;
    for (int b = 1; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
    every_byte += std::string(1, '\0') + "\"\\/\x7f";
    std::vector<Event> t;
    Event msg;
    msg.conv = "c-1";
    msg.seq = 9'007'199'254'740'993;
    msg.mid = "5c1e0d3e-1d4b-4b0a-9d3f-0c0a7b0c1f2e";
    msg.kind = "msg";
    msg.sender = "ana";
    msg.body = "plain body";
    msg.cmid = "k-1";
    msg.ts = 1'765'000'000'123;
    msg.epoch = 3;
    t.push_back(msg);
    Event m2 = msg;
    m2.body = every_byte;
    m2.sender = every_byte;
    m2.conv = every_byte;
    m2.reply_to = 7;
    m2.edit = EditState{12, "fixed \"typo\"\n\t\xf0\x9f\x91\x8d" + every_byte, -5};
    m2.reactions = {{"\xf0\x9f\x91\x8d", 1000, true}, {"\xe2\x9d\xa4", 3, false}, {every_byte, 0, true}};
    m2.reactions_seq = 99;
    m2.recalled = true;
    m2.attachments = {{"7c9e6679-7425-40de-944b-e07fc1f90ae7", "a \"b\".png", "image/png", 123456789, "ff00"},
                      {"0f8fad5b-d9cb-469f-a165-70867728950e", every_byte, "text/plain", 0, ""}};
    t.push_back(m2);
    Event recall = msg;
    recall.kind = "recall";
    recall.body.reset();
    recall.sender.clear(); // the operator's redaction: sender null
    recall.target = 3;
    recall.seq = -1;
    t.push_back(recall);
    Event join;
    join.conv = "c";
    join.seq = 1;
    join.kind = "join";
    join.sender = "ben";
    join.user = "ben";
    t.push_back(join);
    Event react = msg;
    react.kind = "reaction";
    react.body.reset();
    react.target = 3;
    react.emoji = "\xf0\x9f\x91\x8d";
    react.on = true;
    t.push_back(react);
    // Erased reactions: the emptied fields keep their place when present,
    // else they follow "erased".
    for (int mask = 0; mask < 4; ++mask) {
        Event e = react;
        e.erased = true;
        if (mask & 1) e.emoji.reset();
        if (mask & 2) e.on.reset();
        t.push_back(e);
    }
    Event erased_msg = msg;
    erased_msg.erased = true;
    erased_msg.body.reset();
    erased_msg.cmid.reset();
    t.push_back(erased_msg);
    Event edit = msg;
    edit.kind = "edit";
    edit.target = 3;
    edit.body = "the edited text";
    t.push_back(edit);
    return t;
}

TEST(Codec, events_and_the_frames_that_carry_them_encode_byte_for_byte_as_boost_json_trees_did) {
    const auto table = encoding_table();
    for (std::size_t i = 0; i < table.size(); ++i) {
        const auto& ev = table[i];
        const std::string want = boost::json::serialize(old_encoding::event_json(ev));
        EXPECT_EQ(encode_event(ev), want) << "event " << i;
        EXPECT_EQ(encoded_size(ev), want.size() + 1) << "event " << i;
        EXPECT_EQ(encode_event_push(ev),
                  boost::json::serialize(boost::json::object{{"t", "event"}, {"ev", old_encoding::event_json(ev)}}))
            << "event " << i;
        for (const std::optional<std::string>& rid : {std::optional<std::string>(), std::optional<std::string>("r\"1")}) {
            boost::json::object f{{"t", "fetched"}, {"ev", old_encoding::event_json(ev)}};
            EXPECT_EQ(encode_reply(Fetched{ev}, rid), old_encoding::finish(std::move(f), rid)) << "event " << i;
        }
    }
    for (const std::optional<std::string>& rid : {std::optional<std::string>(), std::optional<std::string>("rid-9")}) {
        Page p;
        p.conv = "c-1";
        p.events = table;
        p.next_after = 40;
        p.has_more = true;
        p.head = 41;
        p.min_seq = 2;
        p.trimmed = true;
        p.epoch = 3;
        EXPECT_EQ(encode_reply(p, rid), old_encoding::page(p, rid));
        p.events.clear();
        EXPECT_EQ(encode_reply(p, rid), old_encoding::page(p, rid));
        HistoryPage h;
        h.conv = "c-2";
        h.events = table;
        h.oldest = 1;
        h.has_older = false;
        h.head = 50;
        EXPECT_EQ(encode_reply(h, rid), old_encoding::history(h, rid));
        h.events.clear();
        EXPECT_EQ(encode_reply(h, rid), old_encoding::history(h, rid));
    }
}

// The store writes a page's events once, while it takes them
// (EventListWriter), and the frame copies that text: the same bytes as the
// events written for the frame, in the order taken or reversed (history
// takes the newest first), with an event that did not fit dropped again.
TEST(Codec, a_page_list_written_once_while_taken_is_the_frame_the_events_make) {
    const auto table = encoding_table();
    for (const bool reversed : {false, true}) {
        EventListWriter w;
        EXPECT_EQ(w.list(reversed), "[]");
        for (const auto& ev : table) {
            EXPECT_EQ(w.add(ev), encoded_size(ev));
            // A second event added and dropped again leaves no trace.
            w.add(table[1]);
            w.drop_last();
        }
        ASSERT_EQ(w.count(), table.size());
        std::vector<Event> page_order = table;
        if (reversed) std::reverse(page_order.begin(), page_order.end());
        boost::json::array want;
        for (const auto& ev : page_order) want.push_back(old_encoding::event_json(ev));
        EXPECT_EQ(w.list(reversed), boost::json::serialize(want)) << "reversed " << reversed;
        for (const std::optional<std::string>& rid : {std::optional<std::string>(), std::optional<std::string>("r-2")}) {
            HistoryPage h;
            h.conv = "c-2";
            h.events = page_order;
            h.events_text = w.list(reversed);
            h.events_text_count = w.count();
            h.oldest = 4;
            h.has_older = true;
            h.head = 50;
            EXPECT_EQ(encode_reply(h, rid), old_encoding::history(h, rid));
            Page p;
            p.conv = "c-1";
            p.events = page_order;
            p.events_text = h.events_text;
            p.events_text_count = h.events_text_count;
            p.next_after = 40;
            EXPECT_EQ(encode_reply(p, rid), old_encoding::page(p, rid));
            // Text for other events than the page's: the frame writes them.
            p.events.pop_back();
            EXPECT_EQ(encode_reply(p, rid), old_encoding::page(p, rid));
        }
    }
    EventListWriter one;
    one.drop_last(); // nothing to drop
    one.add(table[0]);
    EXPECT_EQ(one.list(true), "[" + encode_event(table[0]) + "]");
}

} // namespace
