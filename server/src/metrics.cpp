#include "metrics.hpp"

#include <sstream>

namespace im {

void Metrics::count_request(std::string_view type, std::string_view code) {
    std::lock_guard lk(mu_);
    ++requests_[{std::string(type), std::string(code)}];
}

void Metrics::observe_send_seconds(double s) {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < bounds_.size(); ++i)
        if (s <= bounds_[i]) ++send_buckets_[i];
    ++send_count_;
    send_sum_ += s;
}

std::string Metrics::render(std::size_t pool_in_use, std::size_t pool_size, std::size_t pool_queued) const {
    std::ostringstream o;
    auto gauge = [&](const char* name, const char* help, long long v, const char* type = "gauge") {
        o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
    };
    gauge("im_connections", "Open WebSocket connections.", connections.load());
    gauge("im_connections_total", "WebSocket connections accepted.", connections_total.load(), "counter");
    gauge("im_db_pool_in_use", "Database workers running a job.", static_cast<long long>(pool_in_use));
    gauge("im_db_pool_size", "Database workers.", static_cast<long long>(pool_size));
    gauge("im_db_pool_queued", "Jobs waiting for a database worker.", static_cast<long long>(pool_queued));
    gauge("im_notify_lag_ms", "Last delay from commit to this gateway's notification.", notify_lag_ms.load());
    gauge("im_send_transactions_total", "Transactions that carried sends (a run of pipelined sends shares one).",
          send_transactions.load(), "counter");
    gauge("im_listen_reconnects_total", "LISTEN connection re-establishments.", listen_reconnects.load(), "counter");
    o << "# HELP im_pushes_total Server-initiated frames sent.\n# TYPE im_pushes_total counter\n"
      << "im_pushes_total{t=\"event\"} " << pushes_event.load() << '\n'
      << "im_pushes_total{t=\"hint\"} " << pushes_hint.load() << '\n'
      << "im_pushes_total{t=\"resync\"} " << pushes_resync.load() << '\n';
    std::lock_guard lk(mu_);
    o << "# HELP im_requests_total Requests by type and result code.\n# TYPE im_requests_total counter\n";
    for (const auto& [k, v] : requests_)
        o << "im_requests_total{t=\"" << k.first << "\",code=\"" << k.second << "\"} " << v << '\n';
    o << "# HELP im_send_seconds Send latency, request read to reply written.\n# TYPE im_send_seconds histogram\n";
    for (std::size_t i = 0; i < bounds_.size(); ++i)
        o << "im_send_seconds_bucket{le=\"" << bounds_[i] << "\"} " << send_buckets_[i] << '\n';
    o << "im_send_seconds_bucket{le=\"+Inf\"} " << send_count_ << '\n'
      << "im_send_seconds_sum " << send_sum_ << '\n'
      << "im_send_seconds_count " << send_count_ << '\n';
    return o.str();
}

} // namespace im
