#include "net/webhook_deliverer.hpp"

#include "core/faults.hpp"
#include "core/log.hpp"
#include "core/protocol.hpp"
#include "net/net_common.hpp"
#include "store/db_pool.hpp"
#include "store/store.hpp"
#include "store/store_webhooks.hpp"

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/json.hpp>
#include <openssl/hmac.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include <sys/socket.h>

namespace im {

namespace json = boost::json;
namespace ssl = net::ssl;

std::string webhook_signature(const std::string& secret, const std::string& timestamp, const std::string& body) {
    const std::string data = timestamp + "." + body;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(data.data()),
         data.size(), mac, &len);
    static const char* digits = "0123456789abcdef";
    std::string out = "v1=";
    for (unsigned int i = 0; i < len; ++i) {
        out += digits[mac[i] >> 4];
        out += digits[mac[i] & 15];
    }
    return out;
}

std::optional<WebhookUrl> parse_webhook_url(const std::string& url) {
    WebhookUrl u;
    std::string rest;
    if (url.rfind("http://", 0) == 0) rest = url.substr(7);
    else if (url.rfind("https://", 0) == 0) {
        u.tls = true;
        rest = url.substr(8);
    } else return std::nullopt;
    auto slash = rest.find('/');
    std::string authority = rest.substr(0, slash);
    u.target = slash == std::string::npos ? "/" : rest.substr(slash);
    if (authority.empty() || authority.find('@') != std::string::npos) return std::nullopt;
    if (authority.front() == '[') { // [IPv6]:port
        auto close = authority.find(']');
        if (close == std::string::npos) return std::nullopt;
        u.host = authority.substr(1, close - 1);
        if (close + 1 < authority.size()) {
            if (authority[close + 1] != ':') return std::nullopt;
            u.port = authority.substr(close + 2);
        }
    } else {
        auto colon = authority.rfind(':');
        u.host = authority.substr(0, colon);
        if (colon != std::string::npos) u.port = authority.substr(colon + 1);
    }
    if (u.port.empty()) u.port = u.tls ? "443" : "80";
    if (u.host.empty() || u.port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return u;
}

namespace {

template <class Stream>
net::awaitable<int> exchange(Stream& stream, http::request<http::string_body>& req) {
    co_await http::async_write(stream, req, net::use_awaitable);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 * 1024); // the answer's body is not read beyond this
    parser.eager(true);
    co_await http::async_read(stream, buf, parser, net::use_awaitable);
    co_return static_cast<int>(parser.get().result_int());
}

net::awaitable<void> post(const WebhookUrl& u, http::request<http::string_body>& req, ssl::context* tls,
                          std::chrono::milliseconds timeout, HttpOutcome& out) {
    auto ex = co_await net::this_coro::executor;
    net::ip::tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(u.host, u.port, net::use_awaitable);
    if (!tls) {
        beast::tcp_stream stream(ex);
        stream.expires_after(timeout);
        co_await stream.async_connect(results, net::use_awaitable);
        out.status = co_await exchange(stream, req);
        beast::error_code ec;
        stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
        co_return;
    }
    beast::ssl_stream<beast::tcp_stream> stream(ex, *tls);
    beast::get_lowest_layer(stream).expires_after(timeout);
    if (!SSL_set_tlsext_host_name(stream.native_handle(), u.host.c_str()))
        throw beast::system_error(beast::error_code(static_cast<int>(::ERR_get_error()), net::error::get_ssl_category()));
    stream.set_verify_callback(ssl::host_name_verification(u.host));
    co_await beast::get_lowest_layer(stream).async_connect(results, net::use_awaitable);
    co_await stream.async_handshake(ssl::stream_base::client, net::use_awaitable);
    out.status = co_await exchange(stream, req);
    beast::error_code ec;
    beast::get_lowest_layer(stream).socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
}

} // namespace

HttpOutcome webhook_post(const WebhookUrl& u, const std::vector<std::pair<std::string, std::string>>& headers,
                         const std::string& body, std::chrono::milliseconds timeout, bool insecure) {
    HttpOutcome out;
    http::request<http::string_body> req{http::verb::post, u.target, 11};
    const bool default_port = u.port == (u.tls ? "443" : "80");
    const std::string host = u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
    req.set(http::field::host, default_port ? host : host + ":" + u.port);
    req.set(http::field::user_agent, "imserver-webhooks/1");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::connection, "close");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    std::unique_ptr<ssl::context> tls;
    if (u.tls) {
        tls = std::make_unique<ssl::context>(ssl::context::tls_client);
        tls->set_default_verify_paths();
        tls->set_verify_mode(insecure ? ssl::verify_none : ssl::verify_peer);
    }
    net::io_context ioc;
    bool finished = false;
    net::co_spawn(ioc, post(u, req, tls.get(), timeout, out), [&](std::exception_ptr e) {
        finished = true;
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const beast::system_error& se) {
            out.status = 0;
            out.error = se.code() == beast::error::timeout ? "timeout" : se.code().message();
        } catch (const std::exception& ex) {
            out.status = 0;
            out.error = ex.what();
        }
    });
    // The resolver has no timeout of its own: the whole call gets one.
    ioc.run_for(timeout + std::chrono::milliseconds(200));
    if (!finished) {
        out.status = 0;
        out.error = "timeout";
    }
    return out;
}

// ---------------------------------------------------------------- the workers

namespace {
// A POST's body holds at most this many bytes of events (and at least one
// event): what ten sync pages could carry before (each page_item_budget).
constexpr std::size_t kBodyBudget = 10 * page_item_budget;
} // namespace

WebhookDeliverer::WebhookDeliverer(std::string url, const Config& cfg, Metrics& metrics, FaultRegistry& faults)
    : url_(std::move(url)), cfg_(cfg), metrics_(metrics), faults_(faults) {
    running_ = cfg_.webhook_workers;
    for (int i = 0; i < cfg_.webhook_workers; ++i)
        threads_.emplace_back([this, i] {
            loop(i);
            std::lock_guard lk(mu_);
            --running_;
            cv_.notify_all();
        });
}

WebhookDeliverer::~WebhookDeliverer() { stop(); }

void WebhookDeliverer::stop() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    {
        std::unique_lock lk(mu_);
        if (!cv_.wait_for(lk, std::chrono::seconds(2), [&] { return running_ == 0; })) {
            // Blocked on a hung database: end the statements' reads.
            for (auto* c : live_) ::shutdown(c->sock(), SHUT_RDWR);
            log_warn("webhook_stop_cut_sessions", {{"sessions", static_cast<long>(live_.size())}});
        }
    }
    for (auto& t : threads_)
        if (t.joinable()) t.join();
}

// ---------------------------------------------------------------- hints

namespace {
// At most this many conversations hinted per webhook: beyond, the hints are
// dropped and the next round sweeps (it reads every cursor anyway).
constexpr std::size_t kMaxHints = 1000;
} // namespace

void WebhookDeliverer::moved(const std::vector<std::string>& payloads) {
    if (cfg_.webhook_workers == 0) return;
    std::lock_guard lk(hint_mu_);
    if (hints_.empty()) return; // no webhook registered: nothing to note
    const auto now = Clock::now();
    for (const auto& p : payloads) {
        if (p.size() < 3 || p[0] != 'e' || p[1] != ' ') continue;
        const auto sp = p.find(' ', 2);
        if (sp == std::string::npos) continue;
        const std::string conv = p.substr(2, sp - 2);
        std::int64_t hi = 0;
        try {
            hi = std::stoll(p.substr(sp + 1));
        } catch (const std::exception&) {
            continue;
        }
        for (auto& [id, h] : hints_) {
            auto [it, fresh] = h.convs.try_emplace(conv, Hint{hi, now});
            if (!fresh) it->second.hi = std::max(it->second.hi, hi);
            if (h.convs.size() > kMaxHints) {
                h.convs.clear();
                h.sweep_now = true;
            }
        }
    }
}

void WebhookDeliverer::resync() {
    std::lock_guard lk(hint_mu_);
    for (auto& [id, h] : hints_) {
        h.convs.clear();
        h.sweep_now = true;
    }
}

void WebhookDeliverer::set_hooks(const std::vector<std::string>& ids) {
    std::lock_guard lk(hint_mu_);
    for (auto it = hints_.begin(); it != hints_.end();)
        it = std::find(ids.begin(), ids.end(), it->first) == ids.end() ? hints_.erase(it) : std::next(it);
    for (const auto& id : ids) hints_.try_emplace(id);
}

bool WebhookDeliverer::plan_claim(const std::string& id, std::vector<std::pair<std::string, std::int64_t>>& out) {
    out.clear();
    std::lock_guard lk(hint_mu_);
    auto& h = hints_[id];
    const auto now = Clock::now();
    const bool sweep = h.sweep_now || now >= h.next_sweep;
    if (sweep) {
        h.sweep_now = false;
        h.next_sweep = now + std::chrono::milliseconds(cfg_.webhook_sweep_ms);
    }
    // A hint older than two sweeps is the sweep's (its conversation failing,
    // leased elsewhere, or not yet discovered): not passed again and again.
    const auto stale = now - 2 * std::chrono::milliseconds(cfg_.webhook_sweep_ms);
    for (auto it = h.convs.begin(); it != h.convs.end();) {
        if (it->second.since < stale) {
            it = h.convs.erase(it);
            continue;
        }
        out.emplace_back(it->first, it->second.hi);
        ++it;
    }
    std::sort(out.begin(), out.end());
    return sweep; // a sweep's `out`: what was hinted when it started
}

void WebhookDeliverer::settle(const std::string& id, const std::string& conv, std::int64_t done) {
    std::lock_guard lk(hint_mu_);
    auto h = hints_.find(id);
    if (h == hints_.end()) return;
    auto it = h->second.convs.find(conv);
    if (it != h->second.convs.end() && it->second.hi <= done) h->second.convs.erase(it);
}

void WebhookDeliverer::swept(const std::string& id, const webhooks::ClaimedBatch& batch,
                             const std::vector<std::pair<std::string, std::int64_t>>& hinted) {
    std::lock_guard lk(hint_mu_);
    auto& h = hints_[id];
    bool unhinted = false;
    for (const auto& cl : batch.convs) {
        const auto at = std::lower_bound(hinted.begin(), hinted.end(), std::make_pair(cl.lease.conv, std::int64_t(0)),
                                         [](const auto& a, const auto& b) { return a.first < b.first; });
        unhinted = unhinted || at == hinted.end() || at->first != cl.lease.conv;
        // A backlog the sweep found goes on by hinted claims.
        if (!cl.caught_up() && h.convs.size() < kMaxHints) {
            auto [it, fresh] = h.convs.try_emplace(cl.lease.conv, Hint{cl.head, Clock::now()});
            if (!fresh) it->second.hi = std::max(it->second.hi, cl.head);
        }
    }
    // More waiting than one claim took, and not all of it known from hints
    // (a backlog after an outage, a lost bus): sweep on.
    if (batch.full && unhinted) h.sweep_now = true;
}

void WebhookDeliverer::loop(int worker) {
    const std::string owner = cfg_.gateway_id + "/" + std::to_string(worker);
    std::unique_ptr<pqxx::connection> conn;
    // The session is listed in live_ while open, so stop() can cut it.
    auto drop = [&] {
        if (!conn) return;
        {
            std::lock_guard lk(mu_);
            live_.erase(std::remove(live_.begin(), live_.end(), conn.get()), live_.end());
        }
        conn.reset();
    };
    struct Dropper {
        std::function<void()> f;
        ~Dropper() { f(); }
    } dropper{drop};
    std::vector<webhooks::Webhook> hooks;
    auto refresh_at = Clock::now();
    std::mt19937_64 rng(std::random_device{}() ^ std::hash<std::string>{}(owner));
    auto backoff = std::chrono::milliseconds(100);

    auto wait = [&](std::chrono::milliseconds d) {
        std::unique_lock lk(mu_);
        return cv_.wait_for(lk, d, [&] { return stop_; });
    };
    auto stopping = [&] {
        std::lock_guard lk(mu_);
        return stop_;
    };

    // A webhook whose receiver failed is left alone (no claim, no page read)
    // until its backoff ends: 250 ms doubling up to --webhook-pause-max-ms
    // (and --webhook-retry-max-ms) while it keeps failing; each
    // conversation's own retry time (1 s doubling) still applies on top. Per
    // worker, in memory.
    struct HookState {
        Clock::time_point not_before{};
        int failures = 0;
    };
    std::map<std::string, HookState> state;
    std::vector<std::pair<std::string, std::int64_t>> hinted; // a hinted claim's conversations
    const std::int64_t fill_events = cfg_.webhook_fill_events;
    const int fill_ms = std::min(cfg_.webhook_fill_ms, cfg_.webhook_poll_ms);

    // One batch of one webhook. The events it read (of any kind, -1: no work
    // or backed off) and whether the claim was full (more may be waiting).
    struct Round {
        std::int64_t read = -1;
        bool full = false;
    };
    auto deliver = [&](const webhooks::Webhook& w) -> Round {
        auto& st = state[w.id];
        if (Clock::now() < st.not_before) return {};
        // A sweep (every cursor) or a hinted claim (the conversations the bus
        // announced), or nothing: no statement at all.
        const bool sweep = plan_claim(w.id, hinted);
        if (!sweep && hinted.empty()) return {};
        // The leases and their pages in one statement (store_webhooks.hpp).
        auto batch = webhooks::claim_pages(*conn, w.id, owner, cfg_.webhook_lease_ms, cfg_.webhook_batch,
                                           cfg_.webhook_give_up_ms, sweep ? nullptr : &hinted);
        ++(sweep ? metrics_.webhook_claims_sweep : metrics_.webhook_claims_hinted);
        for (const auto& [conv, done] : batch.settled) settle(w.id, conv, done);
        if (sweep) swept(w.id, batch, hinted);
        if (batch.convs.empty()) return {};
        Round round{0, batch.full};
        // The body, built as it goes: {"webhook":ID,"events":[{"id":"CONV:SEQ","ev":EVENT},...]},
        // each EVENT as the backend API's page shows it (GET .../events).
        std::string items;
        std::size_t n = 0, bytes = 0;
        std::vector<std::pair<webhooks::Lease, std::int64_t>> taken; // lease, seq it covers up to
        std::vector<webhooks::Lease> unread;                          // released unchanged
        std::vector<bool> caught_up;                                  // of taken: its page reached the head
        bool cut = false;
        for (auto& cl : batch.convs) {
            if (cut) {
                unread.push_back(cl.lease);
                continue;
            }
            std::int64_t upto = cl.upto;
            for (const auto& e : cl.events) {
                const std::string ev = encode_event(e);
                if (bytes > 0 && bytes + ev.size() + 1 > kBodyBudget) { // the body's budget: the rest waits
                    cut = true;
                    upto = e.seq - 1;
                    break;
                }
                bytes += ev.size() + 1;
                ++round.read;
                if (std::find(w.kinds.begin(), w.kinds.end(), e.kind) == w.kinds.end()) continue;
                if (n++) items += ',';
                items += "{\"id\":";
                items += json::serialize(json::value(e.conv + ":" + std::to_string(e.seq)));
                items += ",\"ev\":";
                items += ev;
                items += '}';
            }
            if (upto <= cl.lease.done_seq) { // nothing of it fitted: released unchanged
                unread.push_back(cl.lease);
                continue;
            }
            taken.emplace_back(cl.lease, upto);
            caught_up.push_back(upto >= cl.head);
        }
        if (cut) round.full = true;
        // Delivered (or nothing of the kinds asked for): the hints up to there are done.
        auto settle_taken = [&] {
            for (const auto& [l, upto] : taken) settle(w.id, l.conv, upto);
        };
        if (n == 0) { // nothing of the kinds asked for: the cursors move on
            webhooks::finish_batch(*conn, w.id, taken, unread, false, caught_up, cfg_.webhook_linger_ms);
            settle_taken();
            return round;
        }
        const std::string body = "{\"webhook\":" + json::serialize(json::value(w.id)) + ",\"events\":[" + items + "]}";
        const std::string ts = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
            std::chrono::system_clock::now().time_since_epoch()).count());
        HttpOutcome out;
        if (auto u = parse_webhook_url(w.url)) {
            out = webhook_post(*u,
                               {{"X-Im-Webhook", w.id}, {"X-Im-Timestamp", ts},
                                {"X-Im-Signature", webhook_signature(w.secret, ts, body)}},
                               body, std::chrono::milliseconds(cfg_.webhook_timeout_ms), cfg_.webhook_insecure_tls);
        } else {
            out.error = "not an http:// or https:// URL";
        }
        if (out.status >= 200 && out.status < 300) {
            st = HookState{};
            ++metrics_.webhook_deliveries_ok;
            metrics_.webhook_events_delivered += static_cast<long long>(n);
            // Only now (after the 2xx) do the cursors move: all of them, the
            // unread leases' release and the last success in one statement.
            metrics_.webhook_leases_lost +=
                webhooks::finish_batch(*conn, w.id, taken, unread, true, caught_up, cfg_.webhook_linger_ms);
            settle_taken();
            return round;
        }
        if (!unread.empty()) webhooks::finish_batch(*conn, w.id, {}, unread, false);
        {
            const std::int64_t ceiling = std::min<std::int64_t>(cfg_.webhook_retry_max_ms, cfg_.webhook_pause_max_ms);
            const std::int64_t pause = std::min<std::int64_t>(ceiling, std::int64_t(250) << std::min(st.failures, 10));
            st.not_before = Clock::now() + std::chrono::milliseconds(pause);
            ++st.failures;
        }
        const std::string err = out.status ? "HTTP " + std::to_string(out.status) : out.error;
        if (out.status) ++metrics_.webhook_deliveries_http_error;
        else ++metrics_.webhook_deliveries_network_error;
        log_warn("webhook_delivery_failed", {{"webhook", w.id}, {"events", static_cast<long long>(n)}, {"err", err}});
        if (faults_.broken("rule.webhook_retry")) { // LAB ONLY negative control: at most once
            webhooks::finish_batch(*conn, w.id, taken, {}, false);
            return round;
        }
        for (const auto& [l, upto] : taken) {
            // 1 s doubling up to --webhook-retry-max-ms, each with +-20 % jitter.
            const std::int64_t base =
                std::min<std::int64_t>(cfg_.webhook_retry_max_ms, std::int64_t(1000) << std::min<std::int64_t>(l.attempts, 20));
            const std::int64_t retry =
                std::uniform_int_distribution<std::int64_t>(base * 8 / 10, base * 12 / 10)(rng);
            if (l.give_up) {
                ++metrics_.webhook_batches_failed;
                log_warn("webhook_gave_up", {{"webhook", w.id}, {"conv", l.conv}, {"from_seq", l.done_seq + 1},
                                             {"to_seq", upto}});
            }
            webhooks::attempt_failed(*conn, w.id, l, upto, retry, err);
        }
        return round;
    };

    for (;;) {
        if (stopping()) return;
        try {
            if (!conn || !conn->is_open()) {
                drop();
                conn = open_connection(url_, "imserver-webhooks-" + owner);
                std::lock_guard lk(mu_);
                live_.push_back(conn.get());
            }
            if (Clock::now() >= refresh_at) {
                hooks = webhooks::list(*conn);
                {
                    std::vector<std::string> ids;
                    for (const auto& w : hooks) ids.push_back(w.id);
                    set_hooks(ids);
                }
                for (const auto& w : hooks) webhooks::discover(*conn, w.id);
                if (worker == 0) {
                    auto b = webhooks::backlogs(*conn);
                    std::string backlog =
                        "# HELP im_webhook_backlog_events Events committed past a webhook's cursors (all gateways).\n"
                        "# TYPE im_webhook_backlog_events gauge\n";
                    std::string oldest = "# HELP im_webhook_oldest_undelivered_seconds Age of a webhook's oldest "
                                         "undelivered event.\n# TYPE im_webhook_oldest_undelivered_seconds gauge\n";
                    for (const auto& x : b) {
                        backlog += "im_webhook_backlog_events{webhook=\"" + x.id + "\"} " + std::to_string(x.events) + "\n";
                        oldest += "im_webhook_oldest_undelivered_seconds{webhook=\"" + x.id + "\"} " +
                                  std::to_string(x.oldest_age_s) + "\n";
                    }
                    std::string text = backlog + oldest;
                    metrics_.set_webhook_gauges(std::move(text));
                }
                refresh_at = Clock::now() + std::chrono::milliseconds(cfg_.webhook_refresh_ms);
            }
            bool worked = false, busy = false;
            for (const auto& w : hooks) {
                if (stopping()) return;
                const Round r = deliver(w);
                worked = worked || r.read >= 0;
                busy = busy || r.full || r.read >= fill_events;
            }
            backoff = std::chrono::milliseconds(100);
            // Idle: the poll interval. A small batch: a short wait, so the
            // next one carries more events per claim, page read and POST
            // (bounded: an event waits at most this long more).
            if (!worked && wait(std::chrono::milliseconds(cfg_.webhook_poll_ms))) return;
            if (worked && !busy && fill_ms > 0 && wait(std::chrono::milliseconds(fill_ms))) return;
        } catch (const std::exception& e) {
            if (stopping()) return;
            log_warn("webhook_db_failed", {{"worker", worker}, {"err", e.what()}});
            drop();
            if (wait(backoff)) return;
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
    }
}

} // namespace im
