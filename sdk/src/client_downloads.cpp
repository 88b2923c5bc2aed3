// im::Client: files received (obligation 17). The work is detail::Downloads
// (downloads_p.h); this is its wiring and the public calls.
#include "client_p.h"

namespace im {

void ClientPrivate::setUpDownloads() {
    downloads = new detail::Downloads(
        storage,
        [this] {
            detail::Downloads::Endpoint ep;
            ep.server = conn.transport()->currentUrl();
            if (ep.server.isEmpty() && !conn.urls.isEmpty())
                ep.server = conn.urls.first();
            ep.token = conn.token();
            ep.cas = conn.transport()->trustedCas();
            ep.pinSha256 = conn.transport()->pinnedSha256();
            return ep;
        },
        this);
    connect(downloads, &detail::Downloads::progress, q, &Client::downloadProgress);
    connect(downloads, &detail::Downloads::finished, q, &Client::downloadFinished);
    connect(downloads, &detail::Downloads::failed, q,
            [this](const QString &attId, const QString &code, const QString &message) {
                emit q->downloadFailed(attId, errorFromCode(code), code, message);
            });
}

QString Client::download(const QString &attId, const QString &path) {
    QString why;
    if (!d->downloads->start(attId, path, &why))
        return d->refuse(why);
    return attId;
}

bool Client::cancelDownload(const QString &attId) { return d->downloads->cancel(attId); }
bool Client::isDownloading(const QString &attId) const { return d->downloads->isActive(attId); }

void Client::setDownloadCacheSize(qint64 bytes) {
    if (bytes == d->downloads->cacheLimit())
        return;
    d->downloads->setCacheLimit(bytes);
    emit settingsChanged();
}

qint64 Client::downloadCacheSize() const { return d->downloads->cacheLimit(); }

} // namespace im
