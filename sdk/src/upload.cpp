#include "upload_p.h"

#include "connection_p.h"
#include "logging_p.h"
#include "transport_p.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QThread>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtNetwork/QNetworkRequest>
#include <QtNetwork/QSslConfiguration>

#include <algorithm>
#include <memory>
#include <utility>

namespace im {

namespace {

int statusOf(QNetworkReply *reply) {
    return reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
}

QJsonObject jsonOf(QNetworkReply *reply) { return QJsonDocument::fromJson(reply->readAll()).object(); }

// The SHA-256 of a file, read in blocks (never the whole file in memory);
// empty if it cannot be read.
QString sha256Of(const QString &path) {
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly))
        return {};
    QCryptographicHash h(QCryptographicHash::Sha256);
    if (!h.addData(&f))
        return {};
    return QString::fromLatin1(h.result().toHex());
}

} // namespace

Uploader::Uploader(detail::Storage &storage, Connection &conn, detail::Reporter &reporter,
                   const detail::Backoff &backoff, QObject *parent)
    : QObject(parent), storage_(storage), conn_(conn), reporter_(reporter), backoff_(backoff),
      http_(new QNetworkAccessManager(this)) {
    retryTimer_.setSingleShot(true);
    connect(&retryTimer_, &QTimer::timeout, this, [this] {
        if (busy())
            file_.attId.isEmpty() ? post() : status();
    });
    paceTimer_.setSingleShot(true);
    paceTimer_.setTimerType(Qt::PreciseTimer); // never early: the rate is an upper bound
    connect(&paceTimer_, &QTimer::timeout, this, [this] {
        if (busy() && pacedOffset_ >= 0)
            put(std::exchange(pacedOffset_, -1));
    });
}

void Uploader::setRateLimit(qint64 bytesPerSecond) {
    rateLimit_ = std::max<qint64>(0, bytesPerSecond);
    paceClock_.invalidate(); // the new rate counts from the next PUT
    if (paceTimer_.isActive()) {
        paceTimer_.stop();
        if (busy() && pacedOffset_ >= 0)
            put(std::exchange(pacedOffset_, -1));
    }
}

qint64 Uploader::pieceSize() const {
    if (rateLimit_ <= 0)
        return chunkSize;
    return std::clamp<qint64>(rateLimit_ / 4, 4096, std::max(4096, chunkSize));
}

Uploader::~Uploader() {
    if (reply_)
        reply_->abort();
}

QUrl Uploader::endpoint(const QString &path) const {
    QUrl url = conn_.transport()->currentUrl();
    url.setScheme(url.scheme() == QLatin1String("wss") ? QStringLiteral("https") : QStringLiteral("http"));
    const qsizetype q = path.indexOf(u'?');
    url.setPath(q < 0 ? path : path.left(q));
    url.setQuery(q < 0 ? QString() : path.mid(q + 1));
    url.setFragment({});
    return url;
}

QNetworkReply *Uploader::send(const QByteArray &verb, const QUrl &url, const QByteArray &body, const QByteArray &type) {
    QNetworkRequest req(url);
    req.setRawHeader("Authorization", "Bearer " + conn_.token().toUtf8());
    if (!type.isEmpty())
        req.setHeader(QNetworkRequest::ContentTypeHeader, type);
    req.setAttribute(QNetworkRequest::RedirectPolicyAttribute, QNetworkRequest::ManualRedirectPolicy);
    req.setTransferTimeout(60000); // no byte for a minute: lost (retried from GET)
    const detail::Transport *t = conn_.transport();
    if (url.scheme() == QLatin1String("https")) {
        // The socket's trust, the same way (transport.cpp): TLS 1.2 or
        // later, the configured CAs or the system's, a pin excuses only
        // what it excuses there.
        QSslConfiguration tls = QSslConfiguration::defaultConfiguration();
        tls.setProtocol(QSsl::TlsV1_2OrLater);
        tls.setPeerVerifyMode(QSslSocket::VerifyPeer);
        if (!t->trustedCas().isEmpty())
            tls.setCaCertificates(t->trustedCas());
        req.setSslConfiguration(tls);
    }
    QNetworkReply *reply = verb == "POST"  ? http_->post(req, body)
                           : verb == "PUT" ? http_->put(req, body)
                                           : http_->sendCustomRequest(req, verb, body);
    connect(reply, &QNetworkReply::sslErrors, this, [t, reply](const QList<QSslError> &errors) {
        if (t->pinnedOnly(reply->sslConfiguration().peerCertificate(), errors))
            reply->ignoreSslErrors(errors);
    });
    return reply;
}

void Uploader::start(const QString &cmid, const detail::OutboxFile &file) {
    if (busy())
        return;
    cmid_ = cmid;
    file_ = file;
    failures_ = 0;
    digestRestarts_ = 0;
    tooLargePuts_ = 0;
    paceClock_.invalidate();
    pacedOffset_ = -1;
    ++run_;
    qCDebug(lcOutbox, "upload of %s (%lld bytes, att %s): starting", qUtf8Printable(cmid), file.size,
            qUtf8Printable(file.attId));
    if (file_.attId.isEmpty())
        post();
    else
        status(); // a restart, a reconnect: the server says where it stands
}

void Uploader::stop(const QString &cmid) {
    if (!busy() || (!cmid.isEmpty() && cmid != cmid_))
        return;
    finish();
}

void Uploader::finish() {
    ++run_;
    retryTimer_.stop();
    paceTimer_.stop();
    pacedOffset_ = -1;
    cmid_.clear();
    if (reply_) {
        QNetworkReply *r = reply_;
        reply_ = nullptr;
        r->disconnect(this);
        r->abort();
        r->deleteLater();
    }
    emit idle();
}

void Uploader::remove(const QString &attId) {
    if (attId.isEmpty() || !conn_.isSessionUp())
        return;
    QNetworkReply *r = send("DELETE", endpoint(QStringLiteral("/v1/uploads/") + attId), {}, {});
    connect(r, &QNetworkReply::finished, r, [r, attId] {
        const int code = statusOf(r);
        // 2xx: removed; 404: gone already (or never ours): done either way.
        if (code / 100 != 2 && code != 404)
            qCInfo(lcOutbox, "DELETE of upload %s answered %d: the server's collector removes it", qUtf8Printable(attId),
                   code);
        r->deleteLater();
    });
}

void Uploader::post() {
    QJsonObject o;
    o.insert(QStringLiteral("name"), file_.name);
    o.insert(QStringLiteral("mime"), file_.mime);
    o.insert(QStringLiteral("size"), file_.size);
    o.insert(QStringLiteral("sha256"), file_.sha256);
    QNetworkReply *r = send("POST", endpoint(QStringLiteral("/v1/uploads")),
                            QJsonDocument(o).toJson(QJsonDocument::Compact), "application/json");
    reply_ = r;
    connect(r, &QNetworkReply::finished, this, [this, r] { onPost(r); });
}

void Uploader::status() {
    QNetworkReply *r = send("GET", endpoint(QStringLiteral("/v1/uploads/") + file_.attId), {}, {});
    reply_ = r;
    connect(r, &QNetworkReply::finished, this, [this, r] { onStatus(r); });
}

void Uploader::put(qint64 offset) {
    if (rateLimit_ > 0) {
        // The throttle: this PUT goes once the bytes put since the clock
        // started fit the rate (never blocking: a timer comes back here).
        // After an idle second or more the clock starts again, so a pause
        // never turns into a burst above the rate.
        const qint64 now = paceClock_.isValid() ? paceClock_.elapsed() : 0;
        const qint64 due = (pacedBytes_ * 1000 + rateLimit_ - 1) / rateLimit_;
        if (!paceClock_.isValid() || now > due + 1000) {
            paceClock_.start();
            pacedBytes_ = 0;
        } else if (now < due) {
            pacedOffset_ = offset;
            paceTimer_.start(int(std::min<qint64>(due - now, 3600 * 1000)));
            return;
        }
    }
    QFile f(storage_.outgoingFilePath(cmid_));
    if (!f.open(QIODevice::ReadOnly) || !f.seek(offset))
        return fail(QStringLiteral("STORAGE_ERROR"),
                    QStringLiteral("cannot read the store's copy of the file: %1").arg(f.errorString()));
    const qint64 length = std::min<qint64>(pieceSize(), file_.size - offset);
    QByteArray chunk = f.read(length);
    if (chunk.size() != length)
        return fail(QStringLiteral("STORAGE_ERROR"), QStringLiteral("the store's copy of the file is shorter than "
                                                                    "recorded (%1 bytes)").arg(f.size()));
    if (corruptNext_ && length > 0) {
        corruptNext_ = false;
        chunk[length / 2] = char(chunk.at(length / 2) ^ 0x5a); // QA: damaged on the way, the copy intact
        qCWarning(lcOutbox, "upload of %s: QA hook: one byte of the PUT at %lld flipped", qUtf8Printable(cmid_), offset);
        emit chunkCorrupted(cmid_, offset);
    }
    pacedBytes_ += length;
    QNetworkReply *r = send("PUT", endpoint(QStringLiteral("/v1/uploads/%1?offset=%2").arg(file_.attId).arg(offset)),
                            chunk, "application/octet-stream");
    bytesPut_ += length;
    reply_ = r;
    const QString cmid = cmid_;
    const qint64 total = file_.size;
    connect(r, &QNetworkReply::uploadProgress, this, [this, cmid, offset, total](qint64 sent, qint64) {
        if (cmid == cmid_)
            emit progress(cmid, std::min(total, offset + sent), total);
    });
    connect(r, &QNetworkReply::finished, this, [this, r, offset, length] { onPut(r, offset, length); });
}

void Uploader::onPost(QNetworkReply *reply) {
    reply->deleteLater();
    if (reply != reply_)
        return;
    reply_ = nullptr;
    const int code = statusOf(reply);
    const QJsonObject o = jsonOf(reply);
    if (code == 201 || code == 200) {
        const QString att = o.value(QStringLiteral("att_id")).toString();
        if (att.isEmpty())
            return retryLater(QStringLiteral("POST /v1/uploads answered without att_id"));
        if (!setAttId(att)) // committed before the first PUT
            return;
        if (o.value(QStringLiteral("complete")).toBool())
            return complete();
        return put(qint64(o.value(QStringLiteral("offset")).toDouble()));
    }
    const QString err = o.value(QStringLiteral("code")).toString();
    if (code == 413)
        return fail(QStringLiteral("TOO_LARGE"), QStringLiteral("the server refuses a file of %1 bytes").arg(file_.size));
    if (code == 400)
        return fail(QStringLiteral("INVALID_ARGUMENT"),
                    QStringLiteral("the server refuses the file: %1").arg(o.value(QStringLiteral("message")).toString()));
    retryLater(QStringLiteral("POST /v1/uploads: %1 %2 %3").arg(code).arg(err, reply->errorString()));
}

void Uploader::onStatus(QNetworkReply *reply) {
    reply->deleteLater();
    if (reply != reply_)
        return;
    reply_ = nullptr;
    const int code = statusOf(reply);
    const QJsonObject o = jsonOf(reply);
    if (code == 200) {
        failures_ = 0;
        if (o.value(QStringLiteral("complete")).toBool())
            return complete();
        const qint64 offset = qint64(o.value(QStringLiteral("offset")).toDouble());
        emit progress(cmid_, offset, file_.size);
        return put(offset);
    }
    if (code == 404) {
        // Collected (stale for 24 h) or never ours: a new upload. The send
        // has not gone on the wire yet (it waits for `complete`), so its
        // cmid carries the new att_id from its first attempt on.
        qCInfo(lcOutbox, "upload %s of %s is gone (404): starting a new one", qUtf8Printable(file_.attId),
               qUtf8Printable(cmid_));
        if (setAttId(QString()))
            post();
        return;
    }
    retryLater(QStringLiteral("GET /v1/uploads: %1 %2").arg(code).arg(reply->errorString()));
}

void Uploader::onPut(QNetworkReply *reply, qint64 offset, qint64 length) {
    reply->deleteLater();
    if (reply != reply_)
        return;
    reply_ = nullptr;
    const int code = statusOf(reply);
    const QJsonObject o = jsonOf(reply);
    const QString err = o.value(QStringLiteral("code")).toString();
    if (code == 200) {
        failures_ = 0;
        tooLargePuts_ = 0;
        const qint64 at = qint64(o.value(QStringLiteral("offset")).toDouble());
        emit progress(cmid_, at, file_.size);
        if (o.value(QStringLiteral("complete")).toBool())
            return complete();
        if (at <= offset && length > 0)
            return retryLater(QStringLiteral("PUT at %1 made no progress").arg(offset));
        return put(at);
    }
    if (code == 409 && o.contains(QStringLiteral("offset"))) {
        // OFFSET_MISMATCH: the server stands elsewhere (a PUT of ours whose
        // answer was lost, or a restart): go on from there.
        const qint64 at = qint64(o.value(QStringLiteral("offset")).toDouble());
        qCInfo(lcOutbox, "upload of %s: the server stands at %lld, not %lld", qUtf8Printable(cmid_), at, offset);
        return put(at);
    }
    if (code == 422) {
        // DIGEST_MISMATCH: the server has dropped the bytes (the upload is
        // at 0 again). The copy is hashed again on a thread of its own (a
        // large file must not hold the app's thread), then onRehashed().
        const QString cmid = cmid_;
        const quint64 run = run_;
        auto hash = std::make_shared<QString>();
        QThread *t = QThread::create([hash, path = storage_.outgoingFilePath(cmid_)] { *hash = sha256Of(path); });
        connect(t, &QThread::finished, this, [this, hash, cmid, run] {
            if (run == run_ && cmid == cmid_)
                onRehashed(*hash);
        });
        connect(t, &QThread::finished, t, &QObject::deleteLater);
        t->start();
        return;
    }
    if (code == 404) {
        if (setAttId(QString()))
            post();
        return;
    }
    const QString text = o.value(QStringLiteral("message")).toString();
    if (code == 413 && ++tooLargePuts_ <= 3) {
        // Our PUTs never pass the declared size (at most size - offset
        // bytes from where the server stood): a 413 here means the server
        // stands elsewhere than we were told (a killed process's PUT still
        // being written when the new one arrived). Ask again (GET).
        return retryLater(QStringLiteral("PUT at %1 answered 413 %2 (%3)").arg(offset).arg(err, text));
    }
    if (code == 413)
        return fail(QStringLiteral("TOO_LARGE"), QStringLiteral("the server refuses the upload: %1 %2").arg(err, text));
    if (code == 400)
        return fail(QStringLiteral("INVALID_ARGUMENT"), QStringLiteral("the server refuses the upload: %1 %2").arg(err, text));
    retryLater(QStringLiteral("PUT /v1/uploads: %1 %2 %3").arg(code).arg(err, reply->errorString()));
}

void Uploader::onRehashed(const QString &sha256) {
    // Our copy unchanged: a byte went wrong on the way, start again (a few
    // times). Changed: the store's copy is damaged, and what the user
    // attached is gone: the message fails.
    if (sha256 != file_.sha256)
        return fail(QStringLiteral("DIGEST_MISMATCH"),
                    QStringLiteral("the store's copy of the file changed since sendFile(): not sent"));
    if (++digestRestarts_ > 3)
        return fail(QStringLiteral("DIGEST_MISMATCH"), QStringLiteral("the server's digest check failed 4 times"));
    qCWarning(lcOutbox, "upload of %s: DIGEST_MISMATCH, starting again at 0", qUtf8Printable(cmid_));
    put(0);
}

bool Uploader::setAttId(const QString &attId) {
    if (!storage_.setOutboxUpload(cmid_, attId, false)) {
        reporter_.storageFailed(QStringLiteral("cannot record the upload"), storage_.lastError());
        // Not recorded: a restart would not know it; try again later.
        retryLater(QStringLiteral("STORAGE_ERROR"));
        return false;
    }
    file_.attId = attId;
    emit attIdChanged(cmid_, attId);
    return true;
}

void Uploader::complete() {
    if (!storage_.setOutboxUpload(cmid_, file_.attId, true)) {
        reporter_.storageFailed(QStringLiteral("cannot record the upload"), storage_.lastError());
        return retryLater(QStringLiteral("STORAGE_ERROR"));
    }
    const QString cmid = cmid_, att = file_.attId;
    qCDebug(lcOutbox, "upload of %s complete: %s", qUtf8Printable(cmid), qUtf8Printable(att));
    emit progress(cmid, file_.size, file_.size);
    cmid_.clear();
    paceTimer_.stop();
    pacedOffset_ = -1;
    emit completed(cmid, att);
    emit idle();
}

void Uploader::fail(const QString &code, const QString &message) {
    const QString cmid = cmid_;
    qCWarning(lcOutbox, "upload of %s failed: %s %s", qUtf8Printable(cmid), qUtf8Printable(code),
              qUtf8Printable(message));
    cmid_.clear();
    retryTimer_.stop();
    paceTimer_.stop();
    pacedOffset_ = -1;
    // The message will never carry this upload: the server's side goes now
    // rather than after its collector's 24 h (a damaged copy's bytes too).
    remove(file_.attId);
    emit failed(cmid, code, message);
    emit idle();
}

void Uploader::retryLater(const QString &why) {
    if (!busy())
        return;
    const int delay = backoff_.delayMs(++failures_);
    qCInfo(lcOutbox, "upload of %s: %s; asking where the server stands in %d ms", qUtf8Printable(cmid_),
           qUtf8Printable(why), delay);
    retryTimer_.start(delay);
}

} // namespace im
