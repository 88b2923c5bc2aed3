#include "notifier.hpp"

#include "log.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <map>
#include <sstream>

namespace im {

namespace {

class Receiver : public pqxx::notification_receiver {
public:
    Receiver(pqxx::connection_base& c, std::vector<std::string>& sink)
        : pqxx::notification_receiver(c, notify_channel), sink_(sink) {}
    void operator()(const std::string& payload, int) override { sink_.push_back(payload); }

private:
    std::vector<std::string>& sink_;
};

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

} // namespace

Notifier::Notifier(std::string url, std::shared_ptr<Gateway> gw, Store& store, Metrics& metrics)
    : url_(std::move(url)), gw_(std::move(gw)), store_(store), metrics_(metrics) {}

Notifier::~Notifier() { stop(); }

void Notifier::start() {
    thread_ = std::thread([this] { run(); });
}

void Notifier::stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void Notifier::run() {
    bool lost = false;
    auto backoff = std::chrono::milliseconds(100);
    while (!stop_) {
        try {
            auto conn = open_connection(url_, "imserver-listen-" + gw_->config().gateway_id);
            std::vector<std::string> payloads;
            Receiver receiver(*conn, payloads);
            const int pid = conn->backendpid();
            backoff = std::chrono::milliseconds(100);
            if (lost) {
                // Notifications may have been missed while we were away.
                ++metrics_.listen_reconnects;
                log_warn("listen_restored");
                if (!gw_->config().lab.no_resync) gw_->resync_all(); // the lab's negative control skips it
            }
            lost = true; // any exit from here on is a loss
            auto last_probe = std::chrono::steady_clock::now();
            while (!stop_) {
                conn->await_notification(0, 200000);
                if (!payloads.empty()) {
                    std::vector<std::string> batch;
                    batch.swap(payloads);
                    // Lab: crash here, or lose these notifications with the session.
                    if (gw_->faults().hit("notify.before_publish") == FaultKind::unavailable)
                        throw pqxx::broken_connection("injected fault: notifications lost before publishing");
                    process(*conn, batch);
                }
                // A silently reopened or dead session would have lost LISTEN.
                if (std::chrono::steady_clock::now() - last_probe > std::chrono::seconds(1)) {
                    if (!store_.ping(*conn)) throw pqxx::broken_connection("listen session lost");
                    last_probe = std::chrono::steady_clock::now();
                }
                if (!conn->is_open() || conn->backendpid() != pid) throw pqxx::broken_connection("listen session lost");
            }
        } catch (const std::exception& e) {
            if (stop_) break;
            log_warn("listen_lost", {{"err", e.what()}});
            lost = true;
            std::this_thread::sleep_for(backoff);
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
    }
}

void Notifier::process(pqxx::connection_base& c, const std::vector<std::string>& payloads) {
    if (!gw_->has_any_subscriber()) return;
    // Coalesce: per conversation one read of the committed range.
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> ranges;
    struct ReadMove { std::string conv, user, device; std::int64_t read; };
    std::vector<ReadMove> reads;
    std::vector<std::string> changed;
    for (const auto& p : payloads) {
        std::istringstream in(p);
        std::string kind, conv;
        in >> kind >> conv;
        if (kind == "e") {
            std::int64_t seq = 0;
            in >> seq;
            auto [it, fresh] = ranges.try_emplace(conv, seq, seq);
            if (!fresh) {
                it->second.first = std::min(it->second.first, seq);
                it->second.second = std::max(it->second.second, seq);
            }
        } else if (kind == "r") {
            ReadMove m;
            m.conv = conv;
            in >> m.user >> m.device >> m.read;
            reads.push_back(std::move(m));
        } else if (kind == "x") {
            changed.push_back(conv);
        }
    }
    for (const auto& [conv, range] : ranges) {
        auto b = store_.load_push(c, conv, range.first, range.second);
        if (!b) continue;
        std::map<std::string, std::int64_t> hint_heads; // large conversations: one hint per user
        for (const auto& ev : b->events) {
            metrics_.notify_lag_ms = std::max<std::int64_t>(0, now_ms() - ev.ts);
            std::string frame = b->full ? encode_event_push(ev) : std::string();
            for (const auto& p : b->periods) {
                if (ev.seq < p.from || ev.seq > p.to || !gw_->has_subscribers(p.user)) continue;
                if (b->full) {
                    gw_->push_to_user(p.user, frame);
                    ++metrics_.pushes_event;
                } else {
                    hint_heads[p.user] = std::max(hint_heads[p.user], ev.seq);
                }
            }
        }
        for (const auto& [user, head] : hint_heads) {
            gw_->push_to_user(user, encode_hint(conv, head, b->epoch, std::nullopt));
            ++metrics_.pushes_hint;
        }
    }
    for (const auto& m : reads) {
        if (!gw_->has_subscribers(m.user)) continue;
        auto b = store_.load_push(c, m.conv, 1, 0);
        if (!b) continue;
        gw_->push_to_user(m.user, encode_hint(m.conv, b->head_for(m.user), b->epoch, m.read), m.device);
        ++metrics_.pushes_hint;
    }
    for (const auto& conv : changed) {
        auto b = store_.load_push(c, conv, 1, 0);
        if (!b) continue;
        for (const auto& p : b->periods) {
            if (p.to != INT64_MAX || !gw_->has_subscribers(p.user)) continue;
            gw_->push_to_user(p.user, encode_hint(conv, b->head, b->epoch, std::nullopt));
            ++metrics_.pushes_hint;
        }
    }
}

} // namespace im
