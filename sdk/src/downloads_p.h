// Downloads: the receiving side of files (obligation 17, server.md
// "Attachments"). GET /v1/attachments/{id} on the WebSocket server's own host
// (ws -> http, wss -> https with the socket's trust and pin), Bearer
// credentials, streamed into a partial file in the store's folder, resumed
// with `Range` / `If-Range` after a drop or a restart, the SHA-256 checked
// before the file goes into a bounded LRU cache and to the app's path.
// Nothing here blocks the client's thread: the network is Qt's, the hashing
// and copying of whole files run on a short worker thread each.
//
// Files (docs/sdk.md "Receiving files"), next to the store `<db>`:
//   <db>.cache/<att>            complete, checked files (LRU by mtime)
//   <db>.cache/partial/<att>.part, .etag   a download under way
// where <att> is the att_id percent-encoded.
#pragma once

#include "codec_p.h"

#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QPointer>
#include <QtCore/QString>
#include <QtCore/QTimer>
#include <QtCore/QUrl>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QSslCertificate>

#include <functional>
#include <memory>
#include <optional>

class QFile;
class QNetworkReply;

namespace im::detail {

class Storage;

class Downloads : public QObject {
    Q_OBJECT
public:
    /// Where and as whom to ask, read at each request (the socket's
    /// current server, the current token, the TLS trust and pin).
    struct Endpoint {
        QUrl server; ///< the ws:// or wss:// URL
        QString token;
        QList<QSslCertificate> cas;
        QByteArray pinSha256;
    };
    Downloads(Storage &store, std::function<Endpoint()> endpoint, QObject *parent = nullptr);
    ~Downloads() override;

    /// Starts (or joins) the download of `attId` to `path`. Returns false
    /// with *why set for bad input (nothing started).
    bool start(const QString &attId, const QString &path, QString *why);
    /// Stops the download of `attId` (the partial file is kept: a later
    /// start() resumes it). False if none runs.
    bool cancel(const QString &attId);
    bool isActive(const QString &attId) const { return jobs_.contains(attId); }

    void setCacheLimit(qint64 bytes);
    qint64 cacheLimit() const { return cacheLimit_; }
    /// The folder of the cache (empty when no store is open).
    QString cacheDir() const;
    /// Drops every running download (the store closes).
    void stopAll();

    static constexpr qint64 DefaultCacheLimit = 512LL * 1024 * 1024;
    /// A dropped transfer is tried again this many times (with growing
    /// pauses, from where it stopped) before it fails with UNAVAILABLE.
    static constexpr int MaxRetries = 5;

Q_SIGNALS:
    void progress(const QString &attId, qint64 received, qint64 total);
    void finished(const QString &attId, const QString &path);
    void failed(const QString &attId, const QString &code, const QString &message);

private:
    struct Job;
    void request(const std::shared_ptr<Job> &job);
    void onHeaders(const std::shared_ptr<Job> &job);
    void onData(const std::shared_ptr<Job> &job);
    void onDone(const std::shared_ptr<Job> &job);
    void verifyAndDeliver(const std::shared_ptr<Job> &job);
    void deliverFromCache(const std::shared_ptr<Job> &job, const QString &cached);
    void fail(const std::shared_ptr<Job> &job, const QString &code, const QString &message);
    void retryLater(const std::shared_ptr<Job> &job, const QString &why);
    void evict();
    QString fileKey(const QString &attId) const;

    Storage &store_;
    std::function<Endpoint()> endpoint_;
    QNetworkAccessManager nam_;
    QHash<QString, std::shared_ptr<Job>> jobs_;
    qint64 cacheLimit_ = DefaultCacheLimit;
};

/// True when `errors` are only the ones a pinned certificate makes moot
/// (its chain and name); shared by the socket and the file transfers.
bool pinnedCertificateOnly(const QByteArray &pinSha256, const QSslCertificate &peer,
                           const QList<QSslError> &errors);

} // namespace im::detail
