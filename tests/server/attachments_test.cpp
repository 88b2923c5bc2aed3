// Attachments (spec/server.md "Attachments", contract section 12) over real
// HTTP on the gateway's loopback listener, a real imserver and PostgreSQL:
// upload by offset and resume, the digest check, Range and ETag downloads,
// visibility (contract section 5), limits and bad input changing nothing.
#include "common.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <openssl/sha.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

using namespace im::test;

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct Reply {
    int status = 0;
    std::string body;
    std::map<std::string, std::string> headers;
    json::object json() const {
        json::error_code ec;
        auto v = json::parse(body, ec);
        return !ec && v.is_object() ? v.as_object() : json::object{};
    }
    std::string header(const std::string& k) const {
        auto it = headers.find(k);
        return it == headers.end() ? "" : it->second;
    }
};

std::string sha256_hex(const std::string& data) {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d);
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned char b : d) {
        out += hex[b >> 4];
        out += hex[b & 15];
    }
    return out;
}

std::string random_bytes(std::size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::string s(n, '\0');
    for (auto& ch : s) ch = static_cast<char>(gen() & 0xFF);
    return s;
}

// One request on a fresh connection.
Reply call(unsigned short port, http::verb method, const std::string& target, const std::string& token,
           const std::string& body = {}, const std::map<std::string, std::string>& extra = {}) {
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    s.expires_after(std::chrono::seconds(60));
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    for (auto& [k, v] : extra) req.set(k, v);
    req.body() = body;
    if (method != http::verb::get || !body.empty()) req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(256u << 20);
    http::read(s, buf, p);
    auto& res = p.get();
    Reply r{static_cast<int>(res.result_int()), res.body(), {}};
    for (auto& f : res) r.headers[std::string(f.name_string())] = std::string(f.value());
    beast::error_code ignored;
    s.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return r;
}

// The same suite runs against each store (tests/server/CMakeLists.txt):
// IM_TEST_ATTACHMENTS_STORE=dir runs the gateway with --attachments-dir.
bool dir_store() {
    const char* v = std::getenv("IM_TEST_ATTACHMENTS_STORE");
    return v && std::string(v) == "dir";
}

class Attachments : public ServerSuite {
protected:
    static inline TempDir* files = nullptr;

    static void SetUpTestSuite() {
        pg = new TestPostgres();
        std::vector<std::string> flags{"--quiet"};
        if (dir_store()) {
            files = new TempDir("imatt");
            flags.push_back("--attachments-dir");
            flags.push_back(files->path() + "/store");
        }
        srv = new ServerProcess(pg->url(), flags);
    }
    static void TearDownTestSuite() {
        ServerSuite::TearDownTestSuite();
        delete files;
        files = nullptr;
    }

    static std::string j(const json::object& o) { return json::serialize(o); }
    static std::string scalar(const std::string& sql) { return pg->scalar(sql); }

    Reply start(const TestUser& u, const std::string& name, const std::string& mime, std::int64_t size,
                const std::string& sha) {
        return call(port(), http::verb::post, "/v1/uploads", u.token,
                    j({{"name", name}, {"mime", mime}, {"size", size}, {"sha256", sha}}));
    }
    Reply put(const TestUser& u, const std::string& att, std::int64_t offset, const std::string& bytes) {
        return call(port(), http::verb::put, "/v1/uploads/" + att + "?offset=" + std::to_string(offset), u.token, bytes);
    }
    Reply status(const TestUser& u, const std::string& att) {
        return call(port(), http::verb::get, "/v1/uploads/" + att, u.token);
    }
    Reply download(const TestUser& u, const std::string& att, const std::map<std::string, std::string>& h = {}) {
        return call(port(), http::verb::get, "/v1/attachments/" + att, u.token, {}, h);
    }
    // A complete upload of `data` by `u`; its att_id.
    std::string upload(const TestUser& u, const std::string& data, const std::string& name = "f.bin") {
        auto r = start(u, name, "application/octet-stream", static_cast<std::int64_t>(data.size()), sha256_hex(data));
        EXPECT_EQ(r.status, 201) << r.body;
        const std::string att = str(r.json(), "att_id");
        if (data.empty()) return att;
        auto p = put(u, att, 0, data);
        EXPECT_EQ(p.status, 200) << p.body;
        EXPECT_TRUE(p.json().at("complete").as_bool()) << p.body;
        return att;
    }
    static json::object send_with(WsClient& c, const std::string& conv, const std::string& cmid,
                                  const std::string& body, const std::vector<std::string>& atts) {
        json::array a;
        for (const auto& id : atts) a.push_back(json::value(id));
        return c.request({{"t", "send"}, {"conv", conv}, {"cmid", cmid}, {"body", body}, {"attachments", a}});
    }
    static std::string footprint() {
        return scalar("SELECT (SELECT count(*) FROM uploads) || '/' || (SELECT coalesce(sum(received), 0) FROM uploads) "
                      "|| '/' || (SELECT count(*) FROM upload_chunks) || '/' || "
                      "(SELECT count(*) FROM uploads WHERE complete)");
    }
};

TEST_F(Attachments, an_upload_resumes_from_the_servers_offset_and_downloads_the_same_bytes) {
    auto w = make_world(db(), "attres", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(3 * 1024 * 1024 + 123, 1);
    auto s = start(u, "report.pdf", "application/pdf", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201) << s.body;
    const std::string att = str(s.json(), "att_id");
    EXPECT_EQ(s.json().at("offset").as_int64(), 0);

    const std::size_t first = 1536 * 1024;
    auto p1 = put(u, att, 0, data.substr(0, first));
    ASSERT_EQ(p1.status, 200) << p1.body;
    EXPECT_EQ(p1.json().at("offset").as_int64(), static_cast<std::int64_t>(first));
    EXPECT_FALSE(p1.json().at("complete").as_bool());

    auto st = status(u, att);
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_EQ(st.json().at("offset").as_int64(), static_cast<std::int64_t>(first));
    EXPECT_EQ(st.json().at("size").as_int64(), static_cast<std::int64_t>(data.size()));

    // Not where the server stands: 409 with its offset, nothing written.
    const std::string before = footprint();
    auto wrong = put(u, att, 1000, data.substr(1000, 5000));
    EXPECT_EQ(wrong.status, 409) << wrong.body;
    EXPECT_EQ(str(wrong.json(), "code"), "OFFSET_MISMATCH");
    EXPECT_EQ(wrong.json().at("offset").as_int64(), static_cast<std::int64_t>(first));
    EXPECT_EQ(footprint(), before);

    auto p2 = put(u, att, static_cast<std::int64_t>(first), data.substr(first));
    ASSERT_EQ(p2.status, 200) << p2.body;
    EXPECT_EQ(p2.json().at("offset").as_int64(), static_cast<std::int64_t>(data.size()));
    EXPECT_TRUE(p2.json().at("complete").as_bool());
    EXPECT_EQ(scalar("SELECT complete FROM uploads WHERE att_id = " + q(att)), "t");
    EXPECT_EQ(scalar("SELECT store FROM uploads WHERE att_id = " + q(att)), dir_store() ? "dir" : "pg");
    if (dir_store()) { // sealed: renamed from its temporary name, whole
        EXPECT_EQ(std::filesystem::file_size(files->path() + "/store/" + att), data.size());
        EXPECT_FALSE(std::filesystem::exists(files->path() + "/store/" + att + ".part"));
        EXPECT_EQ(scalar("SELECT count(*) FROM upload_chunks"), "0");
    }

    auto d = download(u, att);
    ASSERT_EQ(d.status, 200);
    EXPECT_EQ(d.body.size(), data.size());
    EXPECT_TRUE(d.body == data);
    EXPECT_EQ(d.header("Content-Type"), "application/pdf");
    EXPECT_EQ(d.header("ETag"), "\"" + sha256_hex(data) + "\"");
    EXPECT_EQ(d.header("Accept-Ranges"), "bytes");

    // Range: a middle slice across a piece boundary, an open end, a suffix.
    const std::int64_t a = 1024 * 1024 - 10, b = 1024 * 1024 + 9;
    auto r1 = download(u, att, {{"Range", "bytes=" + std::to_string(a) + "-" + std::to_string(b)}});
    ASSERT_EQ(r1.status, 206);
    EXPECT_TRUE(r1.body == data.substr(a, b - a + 1));
    EXPECT_EQ(r1.header("Content-Range"),
              "bytes " + std::to_string(a) + "-" + std::to_string(b) + "/" + std::to_string(data.size()));
    auto r2 = download(u, att, {{"Range", "bytes=" + std::to_string(data.size() - 7) + "-"}});
    ASSERT_EQ(r2.status, 206);
    EXPECT_TRUE(r2.body == data.substr(data.size() - 7));
    auto r3 = download(u, att, {{"Range", "bytes=-5"}});
    ASSERT_EQ(r3.status, 206);
    EXPECT_TRUE(r3.body == data.substr(data.size() - 5));
    auto r4 = download(u, att, {{"Range", "bytes=" + std::to_string(data.size()) + "-"}});
    EXPECT_EQ(r4.status, 416);
    EXPECT_EQ(r4.header("Content-Range"), "bytes */" + std::to_string(data.size()));
    auto nm = download(u, att, {{"If-None-Match", "\"" + sha256_hex(data) + "\""}});
    EXPECT_EQ(nm.status, 304);
    EXPECT_TRUE(nm.body.empty());

    // A complete upload takes no more bytes.
    auto more = put(u, att, static_cast<std::int64_t>(data.size()), "x");
    EXPECT_EQ(more.status, 409) << more.body;
    EXPECT_GT(srv->metric("im_attachment_bytes_in_total"), static_cast<long long>(data.size()) - 1);
    EXPECT_GT(srv->metric("im_attachment_bytes_out_total"), static_cast<long long>(data.size()) - 1);
}

// RFC 9110 13.1.5: a Range with an If-Range applies only when the
// validator is our (strong) ETag; any other tag, a weak one or a date
// means the client's partial copy is of other bytes: the whole file, 200.
TEST_F(Attachments, a_range_with_an_if_range_that_does_not_match_the_etag_gets_the_whole_file) {
    auto w = make_world(db(), "attifr", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(300 * 1024 + 9, 17);
    const std::string att = upload(u, data);
    const std::string etag = "\"" + sha256_hex(data) + "\"";
    auto same = download(u, att, {{"Range", "bytes=100-199"}, {"If-Range", etag}});
    EXPECT_EQ(same.status, 206);
    EXPECT_TRUE(same.body == data.substr(100, 100));
    EXPECT_EQ(same.header("Content-Range"), "bytes 100-199/" + std::to_string(data.size()));
    for (const std::string& other : {std::string("\"") + std::string(64, '0') + "\"", "W/" + etag,
                                     std::string("Sun, 06 Nov 1994 08:49:37 GMT")}) {
        auto whole = download(u, att, {{"Range", "bytes=100-199"}, {"If-Range", other}});
        EXPECT_EQ(whole.status, 200) << other;
        EXPECT_TRUE(whole.body == data) << other;
        EXPECT_EQ(whole.header("Content-Range"), "") << other;
        EXPECT_EQ(whole.header("ETag"), etag) << other;
    }
    // Without a Range, If-Range changes nothing.
    EXPECT_EQ(download(u, att, {{"If-Range", "W/" + etag}}).status, 200);
}

TEST_F(Attachments, a_connection_killed_mid_body_keeps_the_committed_pieces_and_the_upload_goes_on_from_there) {
    auto w = make_world(db(), "attkill", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(5 * 1024 * 1024, 2);
    auto s = start(u, "video.mp4", "video/mp4", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201) << s.body;
    const std::string att = str(s.json(), "att_id");
    {
        // Declares the whole file, sends 40 % and two more pieces' worth, dies.
        net::io_context ioc;
        beast::tcp_stream st(ioc);
        st.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
        std::string head = "PUT /v1/uploads/" + att + "?offset=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           u.token + "\r\nContent-Length: " + std::to_string(data.size()) + "\r\n\r\n";
        net::write(st.socket(), net::buffer(head));
        net::write(st.socket(), net::buffer(data.data(), 2 * 1024 * 1024 + 512 * 1024));
        // The first two pieces are committed once the server has read them.
        wait_until([&] { return scalar("SELECT received FROM uploads WHERE att_id = " + q(att)) == "2097152"; }, 20s,
                   "the first two pieces committed");
        st.socket().close();
    }
    // The half piece in flight is not counted; the server says where to go on.
    auto st = status(u, att);
    ASSERT_EQ(st.status, 200) << st.body;
    const auto at = st.json().at("offset").as_int64();
    EXPECT_EQ(at, 2 * 1024 * 1024);
    EXPECT_FALSE(st.json().at("complete").as_bool());
    auto p = put(u, att, at, data.substr(static_cast<std::size_t>(at)));
    ASSERT_EQ(p.status, 200) << p.body;
    EXPECT_TRUE(p.json().at("complete").as_bool());
    auto d = download(u, att);
    ASSERT_EQ(d.status, 200);
    EXPECT_TRUE(d.body == data);
    EXPECT_EQ(scalar("SELECT count(*) FROM uploads WHERE owner_user = " + q(u.user)), "1");
}

TEST_F(Attachments, a_wrong_digest_answers_DIGEST_MISMATCH_and_the_upload_starts_again_at_zero) {
    auto w = make_world(db(), "attdig", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(1500 * 1024, 3);
    std::string other = data;
    other[777] ^= 1;
    auto s = start(u, "a.bin", "application/octet-stream", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201);
    const std::string att = str(s.json(), "att_id");
    const auto mismatches = srv->metric("im_attachment_digest_mismatches_total");
    auto bad = put(u, att, 0, other);
    EXPECT_EQ(bad.status, 422) << bad.body;
    EXPECT_EQ(str(bad.json(), "code"), "DIGEST_MISMATCH");
    EXPECT_EQ(srv->metric("im_attachment_digest_mismatches_total"), mismatches + 1);
    auto st = status(u, att);
    EXPECT_EQ(st.json().at("offset").as_int64(), 0);
    EXPECT_FALSE(st.json().at("complete").as_bool());
    EXPECT_EQ(scalar("SELECT count(*) FROM upload_chunks WHERE att_id = " + q(att)), "0");
    EXPECT_EQ(download(u, att).status, 404); // never readable while incomplete
    auto good = put(u, att, 0, data);
    ASSERT_EQ(good.status, 200) << good.body;
    EXPECT_TRUE(good.json().at("complete").as_bool());
    EXPECT_TRUE(download(u, att).body == data);
}

// The SHA-256 is computed while the pieces are written (no read-back of
// the whole upload at its end) only when every piece since the row's last
// write went through this gateway: a digest hashed before a restart, or
// around a piece another gateway wrote, must never decide. Declared file:
// P + Q. Gateway A writes P; gateway B writes a wrong Q (422, the upload
// starts again at 0), then a wrong P' at 0; A then gets Q at |P|. A's
// hash of P + Q would match the declaration, but the stored bytes are
// P' + Q: the answer must be 422, and A reads the bytes back to know it.
TEST_F(Attachments, the_digest_hashed_while_writing_decides_only_when_no_one_else_wrote_in_between) {
    std::vector<std::string> flags{"--quiet"};
    if (dir_store()) {
        flags.push_back("--attachments-dir");
        flags.push_back(files->path() + "/store");
    }
    ServerProcess b(pg->url(), flags, "gw-digest-b");
    auto w = make_world(db(), "attrun", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(3 * 1024 * 1024 + 123, 21);
    const std::size_t half = 2u << 20;
    const std::string p = data.substr(0, half), q = data.substr(half);
    auto put_on = [&](unsigned short port_, const std::string& att, std::int64_t off, const std::string& bytes) {
        return call(port_, http::verb::put, "/v1/uploads/" + att + "?offset=" + std::to_string(off), u.token, bytes);
    };

    // One gateway, every piece: hashed while written, nothing read back.
    const auto read_back = srv->metric("im_attachment_digests_read_back_total");
    const std::string whole = upload(u, data, "whole.bin");
    EXPECT_EQ(srv->metric("im_attachment_digests_read_back_total"), read_back);
    EXPECT_TRUE(download(u, whole).body == data);

    // Two gateways, in turn: A's hash of P is stale once B wrote.
    auto s = start(u, "two.bin", "application/octet-stream", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201);
    const std::string att = str(s.json(), "att_id");
    ASSERT_EQ(put_on(port(), att, 0, p).status, 200);
    std::string wrong_q = q;
    wrong_q[5] ^= 1;
    auto r = put_on(b.port(), att, static_cast<std::int64_t>(half), wrong_q);
    ASSERT_EQ(r.status, 422) << r.body;
    std::string wrong_p = p;
    wrong_p[7] ^= 1;
    ASSERT_EQ(put_on(b.port(), att, 0, wrong_p).status, 200);
    const auto before = srv->metric("im_attachment_digests_read_back_total");
    r = put_on(port(), att, static_cast<std::int64_t>(half), q);
    EXPECT_EQ(r.status, 422) << r.body; // stored P' + Q is not the declared file
    EXPECT_EQ(str(r.json(), "code"), "DIGEST_MISMATCH");
    EXPECT_EQ(srv->metric("im_attachment_digests_read_back_total"), before + 1);

    // And the right bytes, P on B and Q on A: read back, complete, the same bytes.
    ASSERT_EQ(put_on(b.port(), att, 0, p).status, 200);
    r = put_on(port(), att, static_cast<std::int64_t>(half), q);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(r.json().at("complete").as_bool());
    EXPECT_EQ(srv->metric("im_attachment_digests_read_back_total"), before + 2);
    EXPECT_TRUE(download(u, att).body == data);
}

TEST_F(Attachments, visibility_is_the_uploader_or_a_reader_of_a_msg_that_references_it_else_404_alike) {
    auto w = make_world(db(), "attvis", 2); // joins at 1, 2
    const auto& up = w.users[0];
    const auto& member = w.users[1];
    auto stranger = make_user(db(), unique_name("attvis-x"));
    const std::string data = random_bytes(10000, 4);
    const std::string att = upload(up, data);

    EXPECT_EQ(download(up, att).status, 200);
    // Before any message references it: nobody else, and 404 as for an unknown id.
    const auto unknown = download(member, "00000000-0000-4000-8000-000000000000");
    EXPECT_EQ(unknown.status, 404);
    const auto not_yet = download(member, att);
    EXPECT_EQ(not_yet.status, 404);
    EXPECT_EQ(not_yet.body, unknown.body);
    EXPECT_EQ(status(member, att).status, 404);       // an upload is only its uploader's
    EXPECT_EQ(put(member, att, 0, "x").status, 404);
    EXPECT_EQ(download(stranger, att).status, 404);
    EXPECT_EQ(download({}, att).status, 401);
    EXPECT_EQ(call(port(), http::verb::get, "/v1/attachments/" + att, "not-a-token").status, 401);

    // A msg that references it.
    WsClient c(port());
    ASSERT_EQ(str(c.hello(up.token), "t"), "welcome");
    auto sent = send_with(c, w.conv, "m1", "see attached", {att});
    ASSERT_EQ(str(sent, "t"), "sent") << j(sent);
    auto seen = download(member, att);
    EXPECT_EQ(seen.status, 200);
    EXPECT_TRUE(seen.body == data);
    EXPECT_EQ(download(stranger, att).status, 404);

    // A former member: a msg after their period is not theirs to read.
    admin_ok(db(), {"member", "remove", w.conv, member.user});
    const std::string att2 = upload(up, random_bytes(100, 5));
    auto sent2 = send_with(c, w.conv, "m2", "later", {att2});
    ASSERT_EQ(str(sent2, "t"), "sent") << j(sent2);
    EXPECT_EQ(download(member, att2).status, 404);
    EXPECT_EQ(download(member, att).status, 200); // their own past stays readable
}

// A PUT whose body the parser has finished before the server reads any of
// it (Content-Length: 0) has no piece to store. Before 718d9f9 the server
// took the unset body size for a full piece: it appended that many bytes of
// its own (zeros) and moved the offset. A file of zeros makes the phantom
// piece pass the digest: the empty PUT "completed" the upload.
TEST_F(Attachments, an_empty_put_stores_no_phantom_piece_and_the_offset_stays_where_it_was) {
    auto w = make_world(db(), "attempty", 1);
    const auto& u = w.users[0];
    const std::string zeros(1000, '\0');
    auto s = start(u, "zeros.bin", "application/octet-stream", static_cast<std::int64_t>(zeros.size()), sha256_hex(zeros));
    ASSERT_EQ(s.status, 201) << s.body;
    const std::string att = str(s.json(), "att_id");
    auto e = put(u, att, 0, "");
    ASSERT_EQ(e.status, 200) << e.body;
    EXPECT_EQ(e.json().at("offset").as_int64(), 0) << e.body;
    EXPECT_FALSE(e.json().at("complete").as_bool()) << e.body;
    EXPECT_EQ(scalar("SELECT received || '/' || complete FROM uploads WHERE att_id = " + q(att)), "0/false");
    EXPECT_EQ(download(u, att).status, 404);
    // The real bytes go on from 0.
    auto p = put(u, att, 0, zeros);
    ASSERT_EQ(p.status, 200) << p.body;
    EXPECT_TRUE(p.json().at("complete").as_bool()) << p.body;
}

// The SDK's kill test found it (718d9f9): an upload left at offset == size,
// not complete, whose client then sends the empty PUT that completes it.
// The state comes from a last piece stored while its request had not
// ended: the finish answered 503 (a database or fsync error), the gateway
// killed between the last piece's commit and the finish, or a restarted
// client asking GET /v1/uploads while the finish still runs. Reached here
// over HTTP alone: a chunked PUT (no declared length) of the whole file
// plus one byte too many, the connection dropped before its last chunk;
// the server stores both full pieces (the extra byte says the second one
// is full) but never gets to the finish. Before the fix the empty PUT
// counted a phantom byte past the size: 413 TOO_LARGE on a complete
// upload, the user's file failed.
TEST_F(Attachments, an_upload_whose_last_piece_was_stored_before_its_request_ended_completes_with_an_empty_put) {
    auto w = make_world(db(), "attlast", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(2 * 1024 * 1024, 9); // whole pieces: the last one fills up
    auto s = start(u, "photo.raw", "application/octet-stream", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201) << s.body;
    const std::string att = str(s.json(), "att_id");
    {
        net::io_context ioc;
        beast::tcp_stream st(ioc);
        st.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
        const std::string head = "PUT /v1/uploads/" + att + "?offset=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                 u.token + "\r\nTransfer-Encoding: chunked\r\n\r\n";
        net::write(st.socket(), net::buffer(head));
        const std::size_t chunk = 256 * 1024;
        for (std::size_t at = 0; at < data.size(); at += chunk) {
            char size_line[32];
            std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk);
            net::write(st.socket(), net::buffer(std::string(size_line)));
            net::write(st.socket(), net::buffer(data.data() + at, chunk));
            net::write(st.socket(), net::buffer(std::string("\r\n")));
        }
        net::write(st.socket(), net::buffer(std::string("1\r\nx\r\n")));
        wait_until([&] { return scalar("SELECT received FROM uploads WHERE att_id = " + q(att)) == "2097152"; }, 20s,
                   "both pieces stored");
        st.socket().close(); // gone before the last chunk ("0")
    }
    auto st = status(u, att);
    ASSERT_EQ(st.status, 200) << st.body;
    EXPECT_EQ(st.json().at("offset").as_int64(), static_cast<std::int64_t>(data.size()));
    EXPECT_FALSE(st.json().at("complete").as_bool());
    auto e = put(u, att, static_cast<std::int64_t>(data.size()), "");
    ASSERT_EQ(e.status, 200) << e.body;
    EXPECT_TRUE(e.json().at("complete").as_bool()) << e.body;
    EXPECT_EQ(e.json().at("offset").as_int64(), static_cast<std::int64_t>(data.size()));
    auto d = download(u, att);
    ASSERT_EQ(d.status, 200);
    EXPECT_TRUE(d.body == data);
}

TEST_F(Attachments, bad_input_is_refused_with_its_code_and_changes_nothing) {
    auto w = make_world(db(), "attbad", 1);
    const auto& u = w.users[0];
    const std::string sha = sha256_hex("abc");
    const std::string before = footprint();
    struct Case { std::string name, mime; std::int64_t size; std::string sha; int status; std::string code; };
    const std::vector<Case> cases = {
        {"", "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a/b.txt", "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a\\b.txt", "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a\nb.txt", "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {std::string(256, 'n'), "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"bad\xC3(utf8", "text/plain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a.txt", "textplain", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a.txt", "text/plain; charset=utf-8", 3, sha, 400, "INVALID_ARGUMENT"},
        {"a.txt", "text/plain", 3, sha.substr(1), 400, "INVALID_ARGUMENT"},
        {"a.txt", "text/plain", 3, std::string(64, 'g'), 400, "INVALID_ARGUMENT"},
        {"a.txt", "text/plain", -1, sha, 400, "INVALID_ARGUMENT"},
        {"a.txt", "text/plain", 104857601, sha, 413, "TOO_LARGE"},
    };
    for (const auto& c : cases) {
        auto r = start(u, c.name, c.mime, c.size, c.sha);
        EXPECT_EQ(r.status, c.status) << c.name << " " << c.mime << " " << r.body;
        EXPECT_EQ(str(r.json(), "code"), c.code) << c.name << " " << c.mime;
    }
    EXPECT_EQ(call(port(), http::verb::post, "/v1/uploads", u.token, "{\"name\":\"x\"}").status, 400);
    EXPECT_EQ(call(port(), http::verb::post, "/v1/uploads", u.token, "not json").status, 400);
    EXPECT_EQ(footprint(), before);

    // An upload of the 100 MiB limit exactly is fine (declared, not sent).
    auto ok = start(u, "ok ünïcödé.bin", "application/octet-stream", 104857600, sha);
    EXPECT_EQ(ok.status, 201) << ok.body;
    const std::string att = str(ok.json(), "att_id");
    const std::string started = footprint();
    // A PUT over 8 MiB, bytes beyond the declared size, a bad offset, an unknown id.
    auto big = call(port(), http::verb::put, "/v1/uploads/" + att + "?offset=0", u.token, std::string((8u << 20) + 1, 'x'));
    EXPECT_EQ(big.status, 413) << big.body;
    EXPECT_EQ(str(big.json(), "code"), "TOO_LARGE");
    auto small = start(u, "s.txt", "text/plain", 3, sha);
    const std::string satt = str(small.json(), "att_id");
    const std::string two = footprint();
    auto beyond = put(u, satt, 0, "abcd");
    EXPECT_EQ(beyond.status, 413) << beyond.body;
    EXPECT_EQ(call(port(), http::verb::put, "/v1/uploads/" + satt, u.token, "abc").status, 400);
    EXPECT_EQ(call(port(), http::verb::put, "/v1/uploads/" + satt + "?offset=-1", u.token, "abc").status, 400);
    EXPECT_EQ(put(u, "not-a-uuid", 0, "abc").status, 404);
    EXPECT_EQ(put(u, "00000000-0000-4000-8000-000000000000", 0, "abc").status, 404);
    EXPECT_EQ(footprint(), two);
    EXPECT_NE(started, two);

    // A 0-byte file is complete at once; its download is empty.
    auto empty = start(u, "empty.txt", "text/plain", 0, sha256_hex(""));
    ASSERT_EQ(empty.status, 201) << empty.body;
    EXPECT_TRUE(empty.json().at("complete").as_bool());
    auto d = download(u, str(empty.json(), "att_id"));
    EXPECT_EQ(d.status, 200);
    EXPECT_TRUE(d.body.empty());
}

TEST_F(Attachments, the_connection_stays_usable_for_the_next_request_and_the_websocket_path_is_unchanged) {
    auto w = make_world(db(), "attka", 1);
    const auto& u = w.users[0];
    const std::string data = random_bytes(300000, 6);
    const std::string att = upload(u, data);
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port()));
    beast::flat_buffer buf;
    for (int i = 0; i < 3; ++i) {
        http::request<http::string_body> req{http::verb::get, "/v1/attachments/" + att, 11};
        req.set(http::field::host, "x");
        req.set(http::field::authorization, "Bearer " + u.token);
        http::write(s, req);
        http::response_parser<http::string_body> p;
        p.body_limit(1u << 20);
        http::read(s, buf, p);
        EXPECT_EQ(p.get().result_int(), 200u);
        EXPECT_TRUE(p.get().body() == data);
        EXPECT_TRUE(p.get().keep_alive());
    }
    // The other routes still answer as before.
    EXPECT_EQ(srv->http("GET", "/healthz").first, 200);
    WsClient c(port());
    EXPECT_EQ(str(c.hello(u.token), "t"), "welcome");
}

TEST_F(Attachments, a_send_with_attachments_carries_them_in_pages_fetches_and_pushes_and_they_are_in_its_fingerprint) {
    auto w = make_world(db(), "attsend", 2);
    const auto& ana = w.users[0];
    const auto& bo = w.users[1];
    const std::string d1 = random_bytes(2000, 7), d2 = random_bytes(3000, 8);
    const std::string a1 = upload(ana, d1, "one.bin"), a2 = upload(ana, d2, "two.bin");
    WsClient ca(port()), cb(port());
    ASSERT_EQ(str(ca.hello(ana.token), "t"), "welcome");
    ASSERT_EQ(str(cb.hello(bo.token), "t"), "welcome");
    ASSERT_EQ(str(cb.request({{"t", "sub"}}), "t"), "subscribed");

    // Not ana's (bo's upload), incomplete, unknown: NOT_FOUND, nothing written.
    const std::string bos = upload(bo, "bo's bytes");
    auto inc = start(ana, "inc.bin", "application/octet-stream", 10, sha256_hex("0123456789"));
    const std::string incomplete = str(inc.json(), "att_id");
    const std::string events_before = scalar("SELECT count(*) FROM events WHERE conv_id = " + q(w.conv));
    for (const auto& bad : {bos, incomplete, std::string("00000000-0000-4000-8000-000000000000")}) {
        auto r = send_with(ca, w.conv, "bad-" + bad, "x", {a1, bad});
        EXPECT_EQ(str(r, "code"), "NOT_FOUND") << j(r);
    }
    EXPECT_EQ(scalar("SELECT count(*) FROM events WHERE conv_id = " + q(w.conv)), events_before);
    EXPECT_EQ(scalar("SELECT count(*) FROM event_attachments WHERE conv_id = " + q(w.conv)), "0");

    // An empty body is fine with attachments; the order given is kept.
    auto sent = send_with(ca, w.conv, "k1", "", {a2, a1});
    ASSERT_EQ(str(sent, "t"), "sent") << j(sent);
    EXPECT_FALSE(sent.at("dup").as_bool());
    const auto seq = sent.at("seq").as_int64();
    auto check = [&](const json::object& ev, const std::string& where) {
        ASSERT_TRUE(ev.contains("attachments")) << where << " " << j(ev);
        const auto& list = ev.at("attachments").as_array();
        ASSERT_EQ(list.size(), 2u) << where;
        EXPECT_EQ(str(list[0].as_object(), "att_id"), a2) << where;
        EXPECT_EQ(str(list[0].as_object(), "name"), "two.bin") << where;
        EXPECT_EQ(str(list[0].as_object(), "mime"), "application/octet-stream") << where;
        EXPECT_EQ(list[0].as_object().at("size").as_int64(), 3000) << where;
        EXPECT_EQ(str(list[0].as_object(), "sha256"), sha256_hex(d2)) << where;
        EXPECT_EQ(str(list[1].as_object(), "att_id"), a1) << where;
        EXPECT_EQ(str(ev, "body"), "") << where;
    };
    auto push = cb.wait_push([&](const json::object& o) {
        return str(o, "t") == "event" && o.at("ev").as_object().at("seq").as_int64() == seq;
    });
    ASSERT_TRUE(push);
    check(push->at("ev").as_object(), "push");
    auto page = sync_conv(cb, w.conv, 0);
    bool found = false;
    for (const auto& e : page.at("events").as_array())
        if (e.as_object().at("seq").as_int64() == seq) {
            found = true;
            check(e.as_object(), "page");
        }
    EXPECT_TRUE(found) << j(page);
    auto fetched = cb.request({{"t", "fetch"}, {"conv", w.conv}, {"seq", seq}});
    check(fetched.at("ev").as_object(), "fetch");
    EXPECT_TRUE(download(bo, a1).body == d1);

    // The key: the same content is a duplicate; other attachments (or
    // another order) are other content.
    auto again = send_with(ca, w.conv, "k1", "", {a2, a1});
    EXPECT_TRUE(again.at("dup").as_bool()) << j(again);
    EXPECT_EQ(again.at("seq").as_int64(), seq);
    EXPECT_EQ(str(send_with(ca, w.conv, "k1", "", {a1, a2}), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(str(send_with(ca, w.conv, "k1", "", {a2}), "code"), "IDEMPOTENCY_MISMATCH");
    EXPECT_EQ(str(send_msg(ca, w.conv, "k1", "x"), "code"), "IDEMPOTENCY_MISMATCH"); // without them: other content
    EXPECT_EQ(str(send_msg(ca, w.conv, "k3", ""), "code"), "INVALID_ARGUMENT"); // an empty body needs attachments
    // The fingerprints (contract section 12): a plain send hashes as before v3.
    auto plain = send_msg(ca, w.conv, "k2", "hello");
    ASSERT_EQ(str(plain, "t"), "sent");
    EXPECT_EQ(scalar("SELECT request_hash = sha256(convert_to(conv_id, 'UTF8') || '\\x00'::bytea || "
                     "convert_to(body, 'UTF8')) FROM events WHERE conv_id = " + q(w.conv) + " AND client_msg_id = 'k2'"),
              "t");
    EXPECT_EQ(scalar("SELECT encode(request_hash, 'hex') FROM events WHERE conv_id = " + q(w.conv) +
                     " AND client_msg_id = 'k1'"),
              sha256_hex(w.conv + std::string(1, '\0') + "" + std::string(1, '\0') + "reply:" + std::string(1, '\0') +
                         "att:" + a2 + "," + a1));
    EXPECT_EQ(scalar("SELECT string_agg(att_id::text, ',' ORDER BY ord) FROM event_attachments WHERE conv_id = " +
                     q(w.conv) + " AND seq = " + std::to_string(seq)),
              a2 + "," + a1);
}

// contract section 12, edit: "Body limits as for send (empty allowed only
// when the target has attachments)": a caption removed.
TEST_F(Attachments, an_edit_to_an_empty_body_removes_the_caption_of_a_message_with_attachments_only) {
    auto w = make_world(db(), "attedit", 2);
    const auto& ana = w.users[0];
    const auto& bo = w.users[1];
    const std::string att = upload(ana, random_bytes(2000, 16), "photo.jpg");
    WsClient ca(port()), cb(port());
    ASSERT_EQ(str(ca.hello(ana.token), "t"), "welcome");
    ASSERT_EQ(str(cb.hello(bo.token), "t"), "welcome");
    auto with = send_with(ca, w.conv, "e1", "a caption", {att});
    ASSERT_EQ(str(with, "t"), "sent") << j(with);
    auto plain = send_msg(ca, w.conv, "e2", "just text");
    ASSERT_EQ(str(plain, "t"), "sent") << j(plain);
    const auto with_seq = with.at("seq").as_int64(), plain_seq = plain.at("seq").as_int64();
    auto edit = [](WsClient& c, const std::string& conv, std::int64_t target, const std::string& cmid,
                   const std::string& body) {
        return c.request({{"t", "edit"}, {"conv", conv}, {"target", target}, {"cmid", cmid}, {"body", body}});
    };
    const std::string edits_before = scalar("SELECT count(*) FROM events WHERE kind = 'edit' AND conv_id = " + q(w.conv));
    // Without attachments, or not the caller's to read, or no such msg: as before.
    EXPECT_EQ(str(edit(ca, w.conv, plain_seq, "x1", ""), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(edit(ca, w.conv, 9999, "x2", ""), "code"), "INVALID_ARGUMENT");
    EXPECT_EQ(str(edit(ca, w.conv, 1, "x3", ""), "code"), "INVALID_ARGUMENT"); // a join
    // The other rules still hold for an empty body: bo did not send it.
    EXPECT_EQ(str(edit(cb, w.conv, with_seq, "x4", ""), "code"), "NOT_SENDER");
    EXPECT_EQ(scalar("SELECT count(*) FROM events WHERE kind = 'edit' AND conv_id = " + q(w.conv)), edits_before);

    // The caption removed: an edit event with an empty body; the attachments stay.
    auto removed = edit(ca, w.conv, with_seq, "cap-off", "");
    ASSERT_EQ(str(removed, "t"), "edited") << j(removed);
    EXPECT_FALSE(removed.at("dup").as_bool());
    EXPECT_TRUE(edit(ca, w.conv, with_seq, "cap-off", "").at("dup").as_bool()); // the key as always
    auto ev = cb.request({{"t", "fetch"}, {"conv", w.conv}, {"seq", with_seq}}).at("ev").as_object();
    ASSERT_TRUE(ev.contains("edit")) << j(ev);
    EXPECT_EQ(str(ev.at("edit").as_object(), "body"), "");
    EXPECT_EQ(ev.at("attachments").as_array().size(), 1u) << j(ev);
}

// DELETE /v1/uploads/{id} (docs/protocol.md, "Attachments over HTTP"): the
// SDK's cancel of a pending file. The uploader's own upload only, incomplete
// or not yet referenced; 404 alike for unknown and not yours; 409 once a msg
// references it, changing nothing.
TEST_F(Attachments, the_uploader_deletes_an_unsent_upload_and_a_referenced_one_answers_409_ATTACHMENT_IN_USE) {
    auto w = make_world(db(), "attdel", 2);
    const auto& u = w.users[0];
    const auto& other = w.users[1];
    auto del = [&](const TestUser& who, const std::string& att) {
        return call(port(), http::verb::delete_, "/v1/uploads/" + att, who.token);
    };
    auto exists = [&](const std::string& att) {
        return scalar("SELECT count(*) FROM uploads WHERE att_id = " + q(att)) == "1";
    };
    const std::string store_dir = dir_store() ? files->path() + "/store/" : "";

    // An incomplete upload with a piece written.
    const std::string data = random_bytes(1536 * 1024, 12);
    auto s = start(u, "half.bin", "application/octet-stream", static_cast<std::int64_t>(data.size()), sha256_hex(data));
    ASSERT_EQ(s.status, 201) << s.body;
    const std::string half = str(s.json(), "att_id");
    ASSERT_EQ(put(u, half, 0, data.substr(0, 1024 * 1024)).status, 200);
    if (dir_store()) { EXPECT_TRUE(std::filesystem::exists(store_dir + half + ".part")); }

    // Not the uploader's, unknown, malformed: 404 alike, nothing changes.
    const std::string before = footprint();
    const auto unknown = del(u, "00000000-0000-4000-8000-000000000000");
    EXPECT_EQ(unknown.status, 404) << unknown.body;
    const auto theirs = del(other, half);
    EXPECT_EQ(theirs.status, 404) << theirs.body;
    EXPECT_EQ(theirs.body, unknown.body);
    EXPECT_EQ(del(u, "not-a-uuid").status, 404);
    EXPECT_EQ(call(port(), http::verb::delete_, "/v1/uploads/" + half, "").status, 401);
    EXPECT_EQ(footprint(), before);
    EXPECT_TRUE(exists(half));

    // The uploader's: gone with its bytes; then as unknown as any.
    auto gone = del(u, half);
    ASSERT_EQ(gone.status, 200) << gone.body;
    EXPECT_EQ(str(gone.json(), "att_id"), half);
    EXPECT_FALSE(exists(half));
    EXPECT_EQ(scalar("SELECT count(*) FROM upload_chunks WHERE att_id = " + q(half)), "0");
    if (dir_store()) { EXPECT_FALSE(std::filesystem::exists(store_dir + half + ".part")); }
    EXPECT_EQ(status(u, half).status, 404);
    EXPECT_EQ(put(u, half, 1024 * 1024, data.substr(1024 * 1024)).status, 404);
    EXPECT_EQ(del(u, half).status, 404);

    // A complete upload no msg references yet: gone too.
    const std::string lone = upload(u, random_bytes(3000, 13), "lone.bin");
    if (dir_store()) { EXPECT_TRUE(std::filesystem::exists(store_dir + lone)); }
    ASSERT_EQ(del(u, lone).status, 200);
    EXPECT_FALSE(exists(lone));
    EXPECT_EQ(download(u, lone).status, 404);
    if (dir_store()) { EXPECT_FALSE(std::filesystem::exists(store_dir + lone)); }

    // Referenced by a msg: 409 with its code, the bytes stay readable.
    const std::string used_bytes = random_bytes(5000, 14);
    const std::string used = upload(u, used_bytes, "used.bin");
    WsClient c(port());
    ASSERT_EQ(str(c.hello(u.token), "t"), "welcome");
    auto sent = send_with(c, w.conv, "del1", "with a file", {used});
    ASSERT_EQ(str(sent, "t"), "sent") << j(sent);
    const std::string referenced = footprint();
    auto refused = del(u, used);
    EXPECT_EQ(refused.status, 409) << refused.body;
    EXPECT_EQ(str(refused.json(), "code"), "ATTACHMENT_IN_USE");
    EXPECT_EQ(footprint(), referenced);
    EXPECT_TRUE(download(other, used).body == used_bytes);
    // Other methods on an upload still answer 405.
    EXPECT_EQ(call(port(), http::verb::post, "/v1/uploads/" + used, u.token, "{}").status, 405);
}

// The backend API (server.md: "POST /v1/uploads on the API listener takes a
// "user" field to upload on a user's behalf (write scope)"), and the PUT,
// GET and DELETE that follow it, then a message of the API naming it.
TEST_F(Attachments, the_backend_uploads_on_a_users_behalf_with_a_write_key_and_sends_it_in_that_users_name) {
    std::vector<std::string> flags{"--quiet", "--api-listen", "127.0.0.1:0", "--api-auth-failures", "1000"};
    if (dir_store()) {
        flags.push_back("--attachments-dir");
        flags.push_back(files->path() + "/store");
    }
    ServerProcess api(pg->url(), flags, "gw-api");
    const std::string write_key = admin_ok(db(), {"apikey", "add", unique_name("attw"), "--scope", "write"});
    const std::string read_key = admin_ok(db(), {"apikey", "add", unique_name("attr"), "--scope", "read"});
    auto w = make_world(db(), "attapi", 2);
    const auto& u = w.users[0];
    const auto& member = w.users[1];
    auto stranger = make_user(db(), unique_name("attapi-x"));
    auto parsed = [](const std::string& text) {
        json::error_code ec;
        auto v = json::parse(text, ec);
        return !ec && v.is_object() ? v.as_object() : json::object{};
    };
    const std::string data = random_bytes(1536 * 1024 + 77, 15);
    json::object start_body{{"user", u.user}, {"name", "from-backend.bin"}, {"mime", "application/octet-stream"},
                            {"size", static_cast<std::int64_t>(data.size())}, {"sha256", sha256_hex(data)}};

    // Refusals first, none of them writes anything.
    const std::string before = footprint();
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(start_body), "").first, 401);
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(start_body), "imk_wrong").first, 401);
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(start_body), read_key).first, 403);
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(start_body), u.token).first, 401); // a device token is no API key
    auto nobody = start_body;
    nobody["user"] = unique_name("attapi-nobody");
    auto [st_nobody, body_nobody] = api.api("POST", "/v1/uploads", j(nobody), write_key);
    EXPECT_EQ(st_nobody, 404) << body_nobody;
    auto extra = start_body;
    extra["surely_unknown"] = 1;
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(extra), write_key).first, 400);
    auto anonymous = start_body;
    anonymous.erase("user");
    EXPECT_EQ(api.api("POST", "/v1/uploads", j(anonymous), write_key).first, 400);
    // The gateway's listener still takes no API key.
    EXPECT_EQ(call(port(), http::verb::post, "/v1/uploads", write_key, j(start_body)).status, 401);
    EXPECT_EQ(footprint(), before);

    // Started for u: u's upload, as if u's device had made it.
    auto [st, text] = api.api("POST", "/v1/uploads", j(start_body), write_key);
    ASSERT_EQ(st, 201) << text;
    const std::string att = str(parsed(text), "att_id");
    EXPECT_EQ(scalar("SELECT owner_user FROM uploads WHERE att_id = " + q(att)), u.user);
    const std::size_t first = 1024 * 1024;
    auto [p1, t1] = api.api("PUT", "/v1/uploads/" + att + "?offset=0", data.substr(0, first), write_key);
    ASSERT_EQ(p1, 200) << t1;
    EXPECT_EQ(api.api("PUT", "/v1/uploads/" + att + "?offset=" + std::to_string(first), data.substr(first), read_key).first,
              403);
    auto [g, gt] = api.api("GET", "/v1/uploads/" + att, "", read_key);
    ASSERT_EQ(g, 200) << gt;
    EXPECT_EQ(parsed(gt).at("offset").as_int64(), static_cast<std::int64_t>(first));
    EXPECT_EQ(api.api("GET", "/v1/uploads/00000000-0000-4000-8000-000000000000", "", read_key).first, 404);
    // The device of u sees the same upload and where it stands.
    auto seen = status(u, att);
    ASSERT_EQ(seen.status, 200) << seen.body;
    EXPECT_EQ(seen.json().at("offset").as_int64(), static_cast<std::int64_t>(first));
    EXPECT_EQ(status(member, att).status, 404);
    auto [p2, t2] = api.api("PUT", "/v1/uploads/" + att + "?offset=" + std::to_string(first), data.substr(first), write_key);
    ASSERT_EQ(p2, 200) << t2;
    EXPECT_TRUE(parsed(t2).at("complete").as_bool()) << t2;

    // A message of the API in u's name names it; members read it, strangers do not.
    auto [m, mt] = api.api("POST", "/v1/conversations/" + w.conv + "/messages",
                           j({{"sender", u.user}, {"cmid", "api-att-1"}, {"body", ""}, {"attachments", json::array{att.c_str()}}}),
                           write_key);
    ASSERT_EQ(m, 200) << mt;
    EXPECT_TRUE(download(member, att).body == data);
    EXPECT_EQ(download(stranger, att).status, 404);
    // The backend reads any complete upload with a read key.
    auto [d, dt] = api.api("GET", "/v1/attachments/" + att, "", read_key);
    EXPECT_EQ(d, 200);
    EXPECT_TRUE(dt == data);
    // Referenced now: its DELETE is refused; an unsent one of the backend goes.
    auto [del, delt] = api.api("DELETE", "/v1/uploads/" + att, "", write_key);
    EXPECT_EQ(del, 409) << delt;
    EXPECT_EQ(str(parsed(delt), "code"), "ATTACHMENT_IN_USE");
    auto [st2, text2] = api.api("POST", "/v1/uploads", j(start_body), write_key);
    ASSERT_EQ(st2, 201) << text2;
    const std::string unsent = str(parsed(text2), "att_id");
    EXPECT_EQ(api.api("DELETE", "/v1/uploads/" + unsent, "", read_key).first, 403);
    EXPECT_EQ(api.api("DELETE", "/v1/uploads/" + unsent, "", write_key).first, 200);
    EXPECT_EQ(scalar("SELECT count(*) FROM uploads WHERE att_id = " + q(unsent)), "0");
}

// The backend API's attachment routes count failed keys as its other
// routes do (--api-auth-failures, here 3 with loopback counted), the same
// count per address: an address out of failures gets 429 RATE_LIMITED with
// Retry-After even with a good key, on these routes and the others; and
// each answer has the API's api_call log line with its status.
TEST_F(Attachments, failed_api_keys_on_the_attachment_routes_count_toward_api_auth_failures_and_are_logged) {
    std::vector<std::string> flags{"--api-listen", "127.0.0.1:0", "--api-auth-failures", "3",
                                   "--api-auth-failures-exempt", "none"};
    ServerProcess api(pg->url(), flags, "gw-api-auth");
    const std::string write_key = admin_ok(db(), {"apikey", "add", unique_name("attauth"), "--scope", "write"});
    auto w = make_world(db(), "attauth", 1);
    const std::string data = "three";
    const std::string start_body = j({{"user", w.users[0].user}, {"name", "a.txt"}, {"mime", "text/plain"},
                                      {"size", 5}, {"sha256", sha256_hex(data)}});
    // A good key works, and is not counted.
    auto [ok, ok_body] = api.api("POST", "/v1/uploads", start_body, write_key);
    ASSERT_EQ(ok, 201) << ok_body;
    // Three failures on three attachment routes: no key, a wrong key, a wrong key.
    EXPECT_EQ(api.api("POST", "/v1/uploads", start_body, "").first, 401);
    EXPECT_EQ(api.api("GET", "/v1/attachments/00000000-0000-4000-8000-000000000000", "", "imk_wrong").first, 401);
    EXPECT_EQ(api.api("PUT", "/v1/uploads/00000000-0000-4000-8000-000000000000?offset=0", data, "imk_wrong2").first, 401);
    // Out of failures: refused, the good key too, on these routes and the API's others.
    auto [limited, limited_body] = api.api("POST", "/v1/uploads", start_body, write_key);
    EXPECT_EQ(limited, 429) << limited_body;
    EXPECT_NE(limited_body.find("RATE_LIMITED"), std::string::npos) << limited_body;
    EXPECT_EQ(api.api("GET", "/v1/conversations/" + w.conv + "/events", "", write_key).first, 429);
    const std::string log = api.log();
    EXPECT_NE(log.find(R"("path":"/v1/uploads","status":201)"), std::string::npos) << log;
    EXPECT_NE(log.find(R"("path":"/v1/uploads","status":401)"), std::string::npos) << log;
    EXPECT_NE(log.find(R"("path":"/v1/attachments/00000000-0000-4000-8000-000000000000","status":401)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find(R"("path":"/v1/uploads","status":429)"), std::string::npos) << log;
}

// The collector (server.md: incomplete uploads and complete ones no msg
// references go after 24 h; the bytes of an attachment go when the last msg
// referencing it is purged), here with a 3 s age and a 200 ms interval on
// a gateway of its own beside the suite's.
TEST_F(Attachments, the_collector_removes_stale_and_unreferenced_uploads_and_never_a_referenced_one) {
    std::vector<std::string> flags{"--quiet", "--attachments-gc-after-ms", "3000", "--attachments-gc-interval-ms", "200"};
    if (dir_store()) {
        flags.push_back("--attachments-dir");
        flags.push_back(files->path() + "/store");
    }
    // The suite's gateway collects with its defaults (24 h): only this one removes.
    ServerProcess gc(pg->url(), flags, "gw-gc");
    auto w = make_world(db(), "attgc", 2);
    const auto& u = w.users[0];
    WsClient c(port());
    ASSERT_EQ(str(c.hello(u.token), "t"), "welcome");
    // Referenced at once (well within the age), then two to collect.
    const std::string kept_bytes = random_bytes(5000, 9);
    const std::string kept = upload(u, kept_bytes, "kept.bin");
    auto sent = send_with(c, w.conv, "gc1", "keep me", {kept});
    ASSERT_EQ(str(sent, "t"), "sent") << j(sent);
    const auto seq = sent.at("seq").as_int64();
    const std::string lone = upload(u, random_bytes(4000, 10), "lone.bin");
    auto half = start(u, "half.bin", "application/octet-stream", 3000, sha256_hex(random_bytes(3000, 11)));
    const std::string partial = str(half.json(), "att_id");
    ASSERT_EQ(put(u, partial, 0, random_bytes(1000, 11)).status, 200);

    auto exists = [&](const std::string& att) {
        return scalar("SELECT count(*) FROM uploads WHERE att_id = " + q(att)) == "1";
    };
    // The directory store: files a kill left between a row's DELETE and its
    // unlink (planted here: no row, an hour old), and a file not ours.
    const std::string store_dir = files ? files->path() + "/store/" : "";
    const std::vector<std::string> orphans = {"0f8fad5b-d9cb-469f-a165-70867728950e",
                                              "1f8fad5b-d9cb-469f-a165-70867728950e.part"};
    if (dir_store()) {
        for (const auto& name : orphans) {
            std::ofstream(store_dir + name) << "orphaned bytes";
            std::filesystem::last_write_time(store_dir + name,
                                             std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
        }
        std::ofstream(store_dir + "README.operator") << "not an upload";
        std::filesystem::last_write_time(store_dir + "README.operator",
                                         std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
    }
    wait_until([&] { return !exists(lone) && !exists(partial); }, 30s, "the stale and the unreferenced uploads removed");
    if (dir_store()) {
        wait_until([&] {
            return !std::filesystem::exists(store_dir + orphans[0]) && !std::filesystem::exists(store_dir + orphans[1]);
        }, 30s, "the orphaned files removed");
        EXPECT_TRUE(std::filesystem::exists(store_dir + "README.operator"));
        EXPECT_TRUE(std::filesystem::exists(store_dir + kept)); // its row is there
    }
    EXPECT_EQ(scalar("SELECT count(*) FROM upload_chunks WHERE att_id IN (" + q(lone) + ", " + q(partial) + ")"), "0");
    if (dir_store()) {
        EXPECT_FALSE(std::filesystem::exists(files->path() + "/store/" + lone));
        EXPECT_FALSE(std::filesystem::exists(files->path() + "/store/" + partial + ".part"));
    }
    // Runs go on past the age; a referenced upload stays, bytes and all.
    const auto runs = gc.metric("im_attachment_gc_runs_total");
    wait_until([&] { return gc.metric("im_attachment_gc_runs_total") >= runs + 3; }, 30s, "three more collector runs");
    EXPECT_TRUE(exists(kept));
    EXPECT_TRUE(download(w.users[1], kept).body == kept_bytes);
    EXPECT_GE(gc.metric("im_attachment_gc_uploads_total"), 2);

    // Its msg purged (retention): the last reference is gone, so are its bytes.
    admin_ok(db(), {"purge", w.conv, "--before-seq", std::to_string(seq + 1)});
    EXPECT_EQ(download(w.users[1], kept).status, 404);
    wait_until([&] { return !exists(kept); }, 30s, "the purged message's attachment removed");
    EXPECT_EQ(scalar("SELECT count(*) FROM upload_chunks WHERE att_id = " + q(kept)), "0");
    if (dir_store()) { EXPECT_FALSE(std::filesystem::exists(files->path() + "/store/" + kept)); }
}

} // namespace

// --attachment-nice (docs/operations.md): file transfers run below the
// send path's CPU priority, so a hundred uploads on a small machine cannot
// starve the text acks (docs/benchmarks.md, "Starvation"). The attachment
// workers' threads and their PostgreSQL backends (this cluster is on a
// Unix socket of this host) run at the nice value given; the send path's
// threads do not. And lower priority never means stuck: more uploads at
// once than attachment workers, while text is sent back to back, all
// complete.
TEST_F(Attachments, file_transfers_run_below_the_send_paths_priority_and_more_uploads_than_workers_all_complete) {
    std::vector<std::string> flags{"--quiet", "--attachment-nice", "19", "--attachment-db-pool", "2"};
    if (dir_store()) {
        flags.push_back("--attachments-dir");
        flags.push_back(files->path() + "/store");
    }
    ServerProcess gw(pg->url(), flags, "gw-nice");
    auto w = make_world(db(), "attnice", 2);
    const auto& u = w.users[0];
    std::atomic<bool> stop{false};
    std::atomic<int> acked{0};
    std::thread sender([&] {
        auto c = login(gw.port(), w.users[1]);
        for (int n = 0; !stop; ++n) {
            auto r = c->request({{"t", "send"}, {"conv", w.conv}, {"cmid", "nice" + std::to_string(n)}, {"body", "hi"}});
            if (str(r, "t") == "sent") ++acked;
        }
    });
    // Eight uploads of 2.5 MiB (three pieces each) at once: four times the workers.
    constexpr int uploads = 8;
    std::vector<std::string> data, atts;
    for (int i = 0; i < uploads; ++i) {
        data.push_back(random_bytes((5u << 20) / 2, 900 + static_cast<unsigned>(i)));
        auto r = call(gw.port(), http::verb::post, "/v1/uploads", u.token,
                      j({{"name", "n.bin"}, {"mime", "application/octet-stream"},
                         {"size", static_cast<std::int64_t>(data.back().size())}, {"sha256", sha256_hex(data.back())}}));
        ASSERT_EQ(r.status, 201) << r.body;
        atts.push_back(str(r.json(), "att_id"));
    }
    std::vector<Reply> done(uploads);
    std::vector<std::thread> up;
    for (int i = 0; i < uploads; ++i)
        up.emplace_back([&, i] {
            done[static_cast<std::size_t>(i)] = call(gw.port(), http::verb::put, "/v1/uploads/" + atts[static_cast<std::size_t>(i)] + "?offset=0",
                                                     u.token, data[static_cast<std::size_t>(i)]);
        });
    for (auto& t : up) t.join();
    stop = true;
    sender.join();
    for (int i = 0; i < uploads; ++i) {
        EXPECT_EQ(done[static_cast<std::size_t>(i)].status, 200) << done[static_cast<std::size_t>(i)].body;
        EXPECT_TRUE(done[static_cast<std::size_t>(i)].json().at("complete").as_bool()) << done[static_cast<std::size_t>(i)].body;
        EXPECT_EQ(call(gw.port(), http::verb::get, "/v1/attachments/" + atts[static_cast<std::size_t>(i)], u.token).body,
                  data[static_cast<std::size_t>(i)]);
    }
    EXPECT_GT(acked.load(), 0);

    // The nice value (field 19 of /proc/.../stat) of the gateway's threads
    // by name, and of the attachment workers' backends.
    auto nice_of = [](const std::string& stat_path) {
        std::ifstream f(stat_path);
        std::string s((std::istreambuf_iterator<char>(f)), {});
        std::istringstream in(s.substr(s.rfind(')') + 2));
        std::vector<std::string> fields;
        for (std::string x; in >> x;) fields.push_back(x);
        return fields.size() > 16 ? std::stoi(fields[16]) : -100;
    };
    std::map<std::string, std::set<int>> by_thread;
    const std::string task = "/proc/" + std::to_string(gw.pid()) + "/task";
    for (const auto& e : std::filesystem::directory_iterator(task)) {
        std::ifstream comm(e.path() / "comm");
        std::string name;
        std::getline(comm, name);
        by_thread[name.substr(0, name.find_last_of('-'))].insert(nice_of((e.path() / "stat").string()));
    }
    EXPECT_EQ(by_thread["im-att"], std::set<int>{19});
    EXPECT_EQ(by_thread["im-pool"], std::set<int>{0}); // the send path's workers
    EXPECT_EQ(by_thread["im-io"], std::set<int>{0});
    const std::string backends = scalar(
        "SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE application_name LIKE 'imserver-attachments-%'");
    ASSERT_FALSE(backends.empty());
    std::istringstream pids(backends);
    int seen = 0;
    // The suite's own gateway has attachment backends too (nice 0): this
    // gateway's are the ones at 19, one per worker that opened its
    // connection (both, with eight uploads, unless one worker took all).
    for (std::string p; std::getline(pids, p, ',');)
        if (nice_of("/proc/" + p + "/stat") == 19) ++seen;
    EXPECT_GE(seen, 1);
    EXPECT_LE(seen, 2);
}
