#include "app/serve.hpp"

#include "api/presence.hpp"
#include "store/attachments.hpp"
#include "app/startup.hpp"
#include "bus/nats_bus.hpp"
#include "bus/pg_bus.hpp"
#include "core/log.hpp"
#include "core/metrics.hpp"
#include "net/backend_api.hpp"
#include "net/gateway.hpp"
#include "net/notifier.hpp"
#include "net/webhook_deliverer.hpp"
#include "store/database.hpp"
#include "store/db_pool.hpp"
#include "store/store.hpp"

#include <csignal>
#ifdef __GLIBC__
#include <malloc.h>
#include <pthread.h>
#endif
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

namespace {

void write_ready_file(const std::string& path, unsigned short port) {
    std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << port << '\n';
    }
    std::filesystem::rename(tmp, path);
}

} // namespace

int im::serve(const Config& cfg) {
#ifdef __GLIBC__
    // Memory flat per transfer (issue 50: RSS growth under 3 pieces): a
    // 1 MiB attachment piece is allocated on whichever thread handles it
    // (I/O threads, database workers), and glibc's dynamic mmap threshold
    // rises to the size of the first such block freed, so later ones come
    // from each thread's arena and stay there: a piece's worth of RSS per
    // thread that ever held one. A fixed threshold keeps blocks of 256 KiB
    // and more in mmap, returned at free (docs/benchmarks.md, the profile).
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
    // A log reader that went away (stderr a pipe: a supervisor restarted,
    // `imserver 2>&1 | head`) must not end the gateway and every connection
    // on it: with SIGPIPE ignored a write to that pipe fails with EPIPE
    // instead. Sockets never raise it (Asio and libpq send with
    // MSG_NOSIGNAL); the embedded cluster's programs get the default back
    // (pg_cluster.cpp, spawn).
    std::signal(SIGPIPE, SIG_IGN);
    im::set_log_gateway(cfg.gateway_id);
    im::set_log_quiet(cfg.quiet);
    // The signed-token keys first: a bad key file stops the start at once.
    std::unique_ptr<im::jwt::Verifier> jwt;
    if (auto stop = im::load_jwt_keys(cfg, jwt)) return *stop;
    im::Database db = im::open_database(im::db_conninfo(cfg), cfg.state_dir);
    struct StopCluster {
        im::Database& d;
        ~StopCluster() {
            // The embedded cluster lives and dies with the gateway.
            if (d.cluster) {
                d.cluster->stop();
                im::log_info("embedded_pg_stopped");
            }
        }
    } stopper{db};
    if (auto stop = im::prepare_database(cfg, db.url)) return *stop;

    im::FaultRegistry faults(cfg.enable_faults);
    if (auto stop = im::arm_faults(cfg, faults)) return *stop;

    im::Store store(faults, cfg.lab);
    // The PostgreSQL bus: sends announce their events with their COMMIT
    // (one transaction per reply); NATS publishes after it (bus.hpp).
    if (cfg.bus == "postgres" && cfg.notify_in_commit) store.notify_in_commit(im::notify_channel);
    im::Metrics metrics;
    im::DbPool pool(db.url, static_cast<std::size_t>(cfg.db_pool), im::effective_db_queue(cfg),
                    std::chrono::milliseconds(cfg.db_timeout_ms));
    boost::asio::io_context ioc(cfg.io_threads);
    std::unique_ptr<im::NotificationBus> bus_owner;
    if (cfg.bus == "postgres") bus_owner = std::make_unique<im::PgBus>(db.url, cfg.gateway_id, metrics, cfg.listen_probe_ms,
                                                                    cfg.db_timeout_ms);
    else bus_owner = std::make_unique<im::NatsBus>(cfg.bus, cfg.gateway_id, metrics);
    im::NotificationBus& bus = *bus_owner;
    im::log_info("bus", {{"bus", cfg.bus == "postgres" ? std::string("postgres") : std::string("nats")}});
    auto gw = std::make_shared<im::Gateway>(ioc, cfg, pool, store, metrics, faults, std::move(jwt));
    gw->api().bus = &bus;
    im::Notifier notifier(db.url, gw, store, metrics);
    gw->api().committed = [&notifier](const std::vector<im::Event>& events) { notifier.committed_here(events); };
    // Webhooks: --webhook-workers threads, each its own database session
    // (net/webhook_deliverer.hpp); the bus's payloads tell it what moved.
    im::WebhookDeliverer webhooks(db.url, cfg, metrics, faults);
    notifier.start(
        bus, [&webhooks](const std::vector<std::string>& p) { webhooks.moved(p); }, [&webhooks] { webhooks.resync(); });
    // Presence (contract 13): this gateway's users, its lease, the sweep of dead gateways.
    im::PresenceTracker presence(db.url, cfg.gateway_id, bus, metrics, cfg.presence_lease_ms, cfg.db_timeout_ms);
    gw->set_presence(&presence);
    // Attachments (server.md "Attachments"): the bytes in PostgreSQL, or in
    // the directory every gateway shares (--attachments-dir).
    im::PgBlobStore pg_blobs;
    std::unique_ptr<im::DirBlobStore> dir_blobs;
    if (!cfg.attachments_dir.empty()) dir_blobs = std::make_unique<im::DirBlobStore>(cfg.attachments_dir);
    im::Attachments attachments(dir_blobs ? static_cast<im::BlobStore&>(*dir_blobs) : pg_blobs,
                                cfg.max_attachment_bytes, &faults);
    attachments.count_read_backs(&metrics.attachment_digests_read_back);
    // Their own database workers (--attachment-db-pool): a 1 MiB piece holds
    // a worker for milliseconds, and a hundred uploads must not stand in
    // front of the sends in the pool's queue. With --attachment-nice they
    // (and their backends on this host) run below the send path's CPU
    // priority.
    std::unique_ptr<im::DbPool> attachment_pool;
    if (cfg.attachment_db_pool > 0) {
        attachment_pool = std::make_unique<im::DbPool>(db.url, static_cast<std::size_t>(cfg.attachment_db_pool),
                                                       im::effective_db_queue(cfg),
                                                       std::chrono::milliseconds(cfg.db_timeout_ms),
                                                       "imserver-attachments", cfg.attachment_nice);
        attachments.use_pool(attachment_pool.get());
    }
    gw->set_attachments(&attachments);
    // The collector: every --attachments-gc-interval-ms one pool job that
    // removes batches until none is left (each upload its own transaction:
    // a run cut short goes on at the next).
    boost::asio::steady_timer gc_timer(ioc);
    std::function<void()> gc_next = [&] {
        if (cfg.attachments_gc_interval_ms <= 0 || gw->draining()) return;
        gc_timer.expires_after(std::chrono::milliseconds(cfg.attachments_gc_interval_ms));
        gc_timer.async_wait([&](boost::system::error_code ec) {
            if (ec || gw->draining()) return;
            const bool queued = pool.submit([&](pqxx::connection_base* c) {
                if (c) {
                    try {
                        for (int round = 0; round < 100; ++round) {
                            auto got = attachments.collect(*c, cfg.attachments_gc_after_ms);
                            metrics.attachment_gc_uploads += got.uploads;
                            metrics.attachment_gc_bytes += got.bytes;
                            if (got.uploads == 0) break;
                        }
                        // Files a kill left without their row (directory store).
                        attachments.sweep_orphans(*c, std::min<std::int64_t>(cfg.attachments_gc_after_ms, 3600000));
                        ++metrics.attachment_gc_runs;
                    } catch (const std::exception& e) {
                        im::log_warn("attachment_gc_failed", {{"err", e.what()}});
                    }
                }
                boost::asio::post(ioc, gc_next);
            });
            if (!queued) gc_next();
        });
    };
    gc_next();
    unsigned short port = gw->listen();
    if (auto mp = gw->listen_metrics())
        im::log_info("metrics_listening", {{"listen", cfg.metrics_listen}, {"port", static_cast<int>(*mp)}});
    // The backend API on its own listener (never the WebSocket port).
    im::BackendApi api(*gw);
    std::optional<unsigned short> api_port;
    if (!cfg.api_listen.empty()) {
        try {
            api_port = api.listen(ioc, gw);
        } catch (const std::exception& e) {
            // The default address taken (a second gateway on this host):
            // this one runs without the API. An address asked for must work.
            auto origin = cfg.origin.find("api-listen");
            if (origin != cfg.origin.end() && origin->second != "default") throw;
            im::log_warn("api_not_listening", {{"listen", cfg.api_listen}, {"err", e.what()}});
        }
    }

    // SIGHUP: reload the TLS certificate and key (open connections keep
    // theirs) and the JWT keys.
    boost::asio::signal_set hup(ioc, SIGHUP);
    std::function<void()> wait_hup = [&] {
        hup.async_wait([&](const boost::system::error_code& ec, int) {
            if (ec) return;
            gw->reload_on_hup();
            wait_hup();
        });
    };
    wait_hup();

    boost::asio::signal_set signals(ioc, SIGTERM, SIGINT);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        im::log_info("signal", {{"signal", sig}});
        hup.cancel();
        api.close();
        gw->drain([&ioc] { ioc.stop(); });
    });

    im::log_info("listening", {{"host", cfg.listen_host}, {"port", static_cast<int>(port)}, {"tls", gw->tls() ? "on" : "off"}});
    if (api_port) {
        auto colon = cfg.api_listen.rfind(':');
        im::log_info("api_listening", {{"host", cfg.api_listen.substr(0, colon)},
                                       {"port", static_cast<int>(*api_port)},
                                       {"tls", gw->tls() ? "on" : "off"}});
        if (!cfg.api_ready_file.empty()) write_ready_file(cfg.api_ready_file, *api_port);
    }
    if (!cfg.ready_file.empty()) write_ready_file(cfg.ready_file, port);

    std::vector<std::thread> threads;
    for (int i = 1; i < cfg.io_threads; ++i)
        threads.emplace_back([&ioc, i] {
            ::pthread_setname_np(::pthread_self(), ("im-io-" + std::to_string(i)).c_str());
            ioc.run();
        });
    ioc.run();
    for (auto& t : threads) t.join();
    gw->release_listener();
    api.release_listener();

    webhooks.stop(); // a POST in flight ends (or times out); its leases run out for another gateway
    pool.stop(); // in-flight requests still publish
    if (attachment_pool) attachment_pool->stop();
    gw->set_presence(nullptr);
    presence.stop(); // its users go offline (unless online elsewhere), published before the bus stops
    bus.stop();
    im::log_info("stopped");
    return 0;
}

