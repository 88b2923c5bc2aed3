#include "bus/pg_bus.hpp"

#include "store/db_pool.hpp"
#include "core/log.hpp"
#include "store/store.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <future>
#include <map>
#include <sstream>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace im {

bool NotificationBus::publish_and_wait(std::vector<std::string> payloads) {
    auto promise = std::make_shared<std::promise<bool>>();
    auto result = promise->get_future();
    publish(std::move(payloads), [promise](bool ok) { promise->set_value(ok); });
    return result.get();
}

namespace {

class Receiver : public pqxx::notification_receiver {
public:
    Receiver(pqxx::connection_base& c, std::vector<std::string>& sink)
        : pqxx::notification_receiver(c, notify_channel), sink_(sink) {}
    void operator()(const std::string& payload, int) override { sink_.push_back(payload); }

private:
    std::vector<std::string>& sink_;
};

} // namespace

PgBus::PgBus(std::string url, std::string gateway_id, Metrics& metrics, int probe_ms, int db_timeout_ms)
    : url_(std::move(url)), gateway_id_(std::move(gateway_id)), metrics_(metrics), probe_ms_(probe_ms),
      watchdog_(std::chrono::milliseconds(db_timeout_ms)) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
    publisher_ = std::thread([this] { publish_loop(); });
}

PgBus::~PgBus() {
    stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
}

void PgBus::subscribe(Handlers h) {
    handlers_ = std::move(h);
    listener_ = std::thread([this] { listen_loop(); });
}

void PgBus::stop() {
    {
        std::lock_guard lk(mu_);
        if (stop_.exchange(true)) return;
    }
    cv_.notify_all();
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
    if (listener_.joinable()) listener_.join();
    if (publisher_.joinable()) publisher_.join();
}

std::vector<std::string> PgBus::collapse(const std::vector<std::string>& payloads) {
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> top; // conv -> lowest, highest event seq
    std::vector<std::string> out;
    std::vector<std::string> order;          // conversations in first-seen order
    for (const auto& p : payloads) {
        if (p.size() > 2 && p[0] == 'e' && p[1] == ' ') {
            std::istringstream in(p.substr(2));
            std::string conv;
            std::int64_t seq = 0;
            if (in >> conv >> seq) {
                std::int64_t from = seq;
                if (!(in >> from)) from = seq;
                auto [it, fresh] = top.try_emplace(conv, from, seq);
                if (fresh) order.push_back(conv);
                it->second.first = std::min(it->second.first, from);
                it->second.second = std::max(it->second.second, seq);
                continue;
            }
        }
        bool seen = false;
        for (const auto& o : out) seen = seen || o == p;
        if (!seen) out.push_back(p);
    }
    for (const auto& conv : order) {
        const auto [from, to] = top[conv];
        out.push_back("e " + conv + " " + std::to_string(to) + (from < to ? " " + std::to_string(from) : ""));
    }
    return out;
}

void PgBus::publish(std::vector<std::string> payloads, std::function<void(bool)> done) {
    if (payloads.empty()) return done(true);
    {
        std::lock_guard lk(mu_);
        if (!stop_) {
            queue_.push_back(Pending{std::move(payloads), std::move(done)});
            cv_.notify_one();
            return;
        }
    }
    done(false);
}

void PgBus::publish_loop() {
    std::unique_ptr<pqxx::connection> conn;
    for (;;) {
        std::deque<Pending> batch;
        {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (stop_ && queue_.empty()) return;
            batch.swap(queue_);
        }
        std::vector<std::string> all;
        for (const auto& p : batch) all.insert(all.end(), p.payloads.begin(), p.payloads.end());
        bool ok = false;
        try {
            if (!conn || !conn->is_open()) {
                conn = open_connection(url_, "imserver-notify-" + gateway_id_);
                Watchdog::Watch watch(watchdog_, *conn);
                Store::open_publisher(*conn);
            }
            Watchdog::Watch watch(watchdog_, *conn);
            Store::publish(*conn, collapse(all));
            ok = true;
            ++metrics_.bus_publishes;
        } catch (const std::exception& e) {
            log_warn("notify_publish_failed", {{"err", e.what()}});
            conn.reset();
        }
        for (auto& p : batch) p.done(ok);
    }
}

void PgBus::listen_loop() {
    bool lost = false;
    auto backoff = std::chrono::milliseconds(100);
    const auto probe = std::chrono::milliseconds(probe_ms_);
    while (!stop_) {
        try {
            auto conn = open_connection(url_, "imserver-listen-" + gateway_id_);
            std::vector<std::string> got;
            Receiver receiver(*conn, got);
            const int pid = conn->backendpid();
            backoff = std::chrono::milliseconds(100);
            if (lost) {
                // Notifications may have been missed while we were away.
                ++metrics_.listen_reconnects;
                log_warn("listen_restored");
                handlers_.resync();
            }
            lost = true; // any exit from here on is a loss
            listening_ = true;
            auto last_probe = std::chrono::steady_clock::now();
            while (!stop_) {
                // Everything libpq has already read (on any earlier call) is
                // delivered before this thread sleeps again.
                conn->get_notifs();
                if (!got.empty()) {
                    std::vector<std::string> batch;
                    batch.swap(got);
                    handlers_.deliver(batch);
                    continue;
                }
                const auto now = std::chrono::steady_clock::now();
                if (now - last_probe >= probe) {
                    // A silently reopened or dead session would have lost LISTEN.
                    Watchdog::Watch watch(watchdog_, *conn);
                    if (!Store::probe(*conn) || !conn->is_open() || conn->backendpid() != pid)
                        throw pqxx::broken_connection("listen session lost");
                    last_probe = std::chrono::steady_clock::now();
                    continue;
                }
                auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(last_probe + probe - now).count();
                pollfd fds[2] = {{conn->sock(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
                if (fds[0].fd < 0) throw pqxx::broken_connection("listen session lost");
                ::poll(fds, 2, static_cast<int>(std::max<long long>(1, wait)));
            }
        } catch (const std::exception& e) {
            listening_ = false;
            if (stop_) break;
            log_warn("listen_lost", {{"err", e.what()}});
            lost = true;
            std::this_thread::sleep_for(backoff);
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
    }
}

} // namespace im
