// Downloads: see downloads_p.h.
#include "downloads_p.h"

#include "storage_p.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QDateTime>
#include <QtCore/QDir>
#include <QtCore/QFile>
#include <QtCore/QFileInfo>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QRegularExpression>
#include <QtCore/QThread>
#include <QtNetwork/QNetworkReply>
#include <QtNetwork/QNetworkRequest>
#include <QtNetwork/QSslConfiguration>
#include <QtNetwork/QSslError>

#include <algorithm>

namespace im::detail {

bool pinnedCertificateOnly(const QByteArray &pinSha256, const QSslCertificate &peer, const QList<QSslError> &errors) {
    if (pinSha256.isEmpty() || peer.isNull() || peer.digest(QCryptographicHash::Sha256) != pinSha256)
        return false;
    for (const QSslError &e : errors) {
        switch (e.error()) {
        case QSslError::SelfSignedCertificate:
        case QSslError::SelfSignedCertificateInChain:
        case QSslError::UnableToGetLocalIssuerCertificate:
        case QSslError::UnableToGetIssuerCertificate:
        case QSslError::UnableToVerifyFirstCertificate:
        case QSslError::CertificateUntrusted:
        case QSslError::HostNameMismatch:
            break;
        default:
            return false; // expired, revoked, bad signature...: refused even when pinned
        }
    }
    return true;
}

struct Downloads::Job {
    QString attId;
    QStringList targets;
    std::optional<proto::Attachment> meta; // what a stored msg said of it
    QString etag;                          // the server's ETag ("<sha256>")
    QPointer<QNetworkReply> reply;
    std::unique_ptr<QFile> part;
    QString partPath, etagPath, cachePath;
    qint64 offset = 0;   // bytes of the partial file when the request went out
    qint64 received = 0; // bytes of the partial file now
    qint64 total = -1;
    int status = 0;      // the answer's HTTP status
    int retries = 0;
    bool fromZeroAgain = false; // a digest mismatch started it over once
    bool working = false;       // a worker thread checks / copies it
};

namespace {

QString unquoted(QString etag) {
    if (etag.startsWith(u"W/"))
        etag = etag.mid(2);
    if (etag.size() >= 2 && etag.startsWith(u'"') && etag.endsWith(u'"'))
        etag = etag.mid(1, etag.size() - 2);
    return etag;
}

bool validAttId(const QString &id) {
    static const QRegularExpression re(QStringLiteral("^[A-Za-z0-9._:-]{1,128}$"));
    return re.match(id).hasMatch();
}

// Copies `from` to each target through a temporary name next to it (a
// target is either the old file or the complete new one). Empty on success.
QString copyToTargets(const QString &from, const QStringList &targets) {
    for (const QString &t : targets) {
        const QString tmp = t + QStringLiteral(".imsdk-part");
        QFile::remove(tmp);
        if (!QFile::copy(from, tmp))
            return QStringLiteral("cannot write %1").arg(tmp);
        QFile::remove(t);
        if (!QFile::rename(tmp, t)) {
            QFile::remove(tmp);
            return QStringLiteral("cannot rename %1 to %2").arg(tmp, t);
        }
    }
    return {};
}

void touch(const QString &path) {
    QFile f(path);
    if (f.open(QIODevice::ReadWrite | QIODevice::ExistingOnly))
        f.setFileTime(QDateTime::currentDateTimeUtc(), QFileDevice::FileModificationTime);
}

// Runs `work` on a thread of its own and `then(result)` on `context`'s.
template <typename Work, typename Then>
void offThread(QObject *context, Work work, Then then) {
    auto result = std::make_shared<QString>();
    QThread *t = QThread::create([result, work = std::move(work)]() mutable { *result = work(); });
    QObject::connect(t, &QThread::finished, context, [result, then = std::move(then)]() mutable { then(*result); });
    QObject::connect(t, &QThread::finished, t, &QObject::deleteLater);
    t->start();
}

} // namespace

Downloads::Downloads(Storage &store, std::function<Endpoint()> endpoint, QObject *parent)
    : QObject(parent), store_(store), endpoint_(std::move(endpoint)) {
    nam_.setRedirectPolicy(QNetworkRequest::ManualRedirectPolicy);
}

Downloads::~Downloads() { stopAll(); }

QString Downloads::cacheDir() const {
    if (!store_.isOpen() || store_.path().isEmpty())
        return {};
    return store_.path() + QStringLiteral(".cache");
}

QString Downloads::fileKey(const QString &attId) const {
    return QString::fromLatin1(QUrl::toPercentEncoding(attId));
}

void Downloads::setCacheLimit(qint64 bytes) {
    cacheLimit_ = std::max<qint64>(0, bytes);
    evict();
}

bool Downloads::start(const QString &attId, const QString &path, QString *why) {
    const QString dir = cacheDir();
    if (dir.isEmpty()) {
        *why = QStringLiteral("download: no store is open");
        return false;
    }
    if (!validAttId(attId)) {
        *why = QStringLiteral("download: not an attachment id");
        return false;
    }
    const QFileInfo target(path);
    if (path.isEmpty() || !target.absoluteDir().exists() || target.isDir()) {
        *why = QStringLiteral("download: %1 is not a file in an existing folder").arg(path);
        return false;
    }
    const QString abs = target.absoluteFilePath();
    if (const auto it = jobs_.constFind(attId); it != jobs_.cend()) {
        if (!(*it)->targets.contains(abs))
            (*it)->targets.append(abs);
        return true;
    }
    if (!QDir().mkpath(dir + QStringLiteral("/partial"))) {
        *why = QStringLiteral("download: cannot create %1").arg(dir);
        return false;
    }
    auto job = std::make_shared<Job>();
    job->attId = attId;
    job->targets = {abs};
    job->meta = store_.attachment(attId);
    const QString key = fileKey(attId);
    job->cachePath = dir + u'/' + key;
    job->partPath = dir + QStringLiteral("/partial/") + key + QStringLiteral(".part");
    job->etagPath = dir + QStringLiteral("/partial/") + key + QStringLiteral(".etag");
    jobs_.insert(attId, job);
    const QFileInfo cached(job->cachePath);
    if (cached.exists() && (!job->meta || cached.size() == job->meta->size))
        deliverFromCache(job, job->cachePath);
    else
        request(job);
    return true;
}

bool Downloads::cancel(const QString &attId) {
    const auto job = jobs_.take(attId);
    if (!job)
        return false;
    if (job->reply) {
        job->reply->disconnect(this);
        job->reply->abort();
        job->reply->deleteLater();
    }
    job->part.reset(); // flushed and closed: a later start() resumes it
    return true;
}

void Downloads::stopAll() {
    const QStringList ids = jobs_.keys();
    for (const QString &id : ids)
        cancel(id);
}

void Downloads::request(const std::shared_ptr<Job> &job) {
    job->part.reset();
    job->status = 0;
    // What the partial holds is worth resuming only under the ETag it came
    // with (an attachment's bytes never change, but the store may have
    // been moved between servers).
    QString etag = job->meta ? QStringLiteral("\"%1\"").arg(job->meta->sha256) : QString();
    QFile etagFile(job->etagPath);
    if (etag.isEmpty() && etagFile.open(QIODevice::ReadOnly))
        etag = QString::fromUtf8(etagFile.readAll()).trimmed();
    etagFile.close();
    job->etag = etag;
    qint64 offset = QFileInfo(job->partPath).size();
    if (etag.isEmpty() || (job->meta && offset > job->meta->size)) {
        QFile::remove(job->partPath);
        offset = 0;
    }
    if (job->meta && job->meta->size > 0 && offset == job->meta->size) {
        job->received = offset;
        job->total = offset;
        return verifyAndDeliver(job); // the drop came after the last byte
    }
    job->part = std::make_unique<QFile>(job->partPath);
    if (!job->part->open(offset > 0 ? QIODevice::WriteOnly | QIODevice::Append
                                     : QIODevice::WriteOnly | QIODevice::Truncate))
        return fail(job, QStringLiteral("STORAGE_ERROR"),
                    QStringLiteral("cannot write %1: %2").arg(job->partPath, job->part->errorString()));
    job->offset = job->received = offset;

    const Endpoint ep = endpoint_();
    QUrl url = ep.server;
    const bool tls = url.scheme() == u"wss" || url.scheme() == u"https";
    url.setScheme(tls ? QStringLiteral("https") : QStringLiteral("http"));
    url.setPath(QStringLiteral("/v1/attachments/") + fileKey(job->attId), QUrl::StrictMode);
    url.setQuery(QString());
    url.setFragment(QString());
    QNetworkRequest req(url);
    req.setRawHeader("Authorization", "Bearer " + ep.token.toUtf8());
    req.setAttribute(QNetworkRequest::CacheLoadControlAttribute, QNetworkRequest::AlwaysNetwork);
    req.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
    if (offset > 0) {
        req.setRawHeader("Range", "bytes=" + QByteArray::number(offset) + '-');
        req.setRawHeader("If-Range", etag.toUtf8());
    }
    if (tls) {
        QSslConfiguration c = QSslConfiguration::defaultConfiguration();
        c.setProtocol(QSsl::TlsV1_2OrLater);
        c.setPeerVerifyMode(QSslSocket::VerifyPeer);
        if (!ep.cas.isEmpty())
            c.setCaCertificates(ep.cas);
        req.setSslConfiguration(c);
    }
    QNetworkReply *reply = nam_.get(req);
    job->reply = reply;
    const QByteArray pin = ep.pinSha256;
    connect(reply, &QNetworkReply::sslErrors, this, [reply, pin](const QList<QSslError> &errors) {
        if (pinnedCertificateOnly(pin, reply->sslConfiguration().peerCertificate(), errors))
            reply->ignoreSslErrors(errors);
    });
    connect(reply, &QNetworkReply::metaDataChanged, this, [this, job, reply] {
        if (job->reply == reply)
            onHeaders(job);
    });
    connect(reply, &QNetworkReply::readyRead, this, [this, job, reply] {
        if (job->reply == reply)
            onData(job);
    });
    connect(reply, &QNetworkReply::finished, this, [this, job, reply] {
        reply->deleteLater();
        if (job->reply == reply)
            onDone(job);
    });
}

void Downloads::onHeaders(const std::shared_ptr<Job> &job) {
    QNetworkReply *reply = job->reply;
    job->status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    if (job->status != 200 && job->status != 206)
        return;
    const QString etag = QString::fromUtf8(reply->rawHeader("ETag"));
    if (!etag.isEmpty() && etag != job->etag) {
        job->etag = etag;
        QFile f(job->etagPath);
        if (f.open(QIODevice::WriteOnly | QIODevice::Truncate))
            f.write(etag.toUtf8());
    }
    if (job->status == 200) {
        // The whole file (no Range asked, or the server chose to send it
        // all: If-Range did not match): start the partial over.
        if (job->received > 0) {
            job->part->resize(0);
            job->offset = job->received = 0;
        }
        job->total = reply->header(QNetworkRequest::ContentLengthHeader).isValid()
                         ? reply->header(QNetworkRequest::ContentLengthHeader).toLongLong()
                         : (job->meta ? job->meta->size : -1);
        return;
    }
    // 206: "bytes first-last/size"; it must start where the partial ends.
    static const QRegularExpression range(QStringLiteral("^bytes (\\d+)-(\\d+)/(\\d+)$"));
    const auto m = range.match(QString::fromLatin1(reply->rawHeader("Content-Range")));
    if (!m.hasMatch() || m.captured(1).toLongLong() != job->offset) {
        job->status = -1; // onDone starts over from 0
        reply->abort();
        return;
    }
    job->total = m.captured(3).toLongLong();
}

void Downloads::onData(const std::shared_ptr<Job> &job) {
    if (job->status != 200 && job->status != 206)
        return; // an error's body: read at the end
    const QByteArray data = job->reply->readAll();
    if (data.isEmpty())
        return;
    if (job->part->write(data) != data.size()) {
        const QString e = job->part->errorString();
        if (job->reply) {
            job->reply->disconnect(this);
            job->reply->abort();
        }
        return fail(job, QStringLiteral("STORAGE_ERROR"), QStringLiteral("cannot write %1: %2").arg(job->partPath, e));
    }
    job->received += data.size();
    emit progress(job->attId, job->received, job->total);
}

void Downloads::onDone(const std::shared_ptr<Job> &job) {
    QNetworkReply *reply = job->reply;
    const int status = job->status > 0 ? job->status
                                       : reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    if ((status == 200 || status == 206) && reply->error() == QNetworkReply::NoError)
        onData(job); // anything not read yet
    job->reply = nullptr;
    if (jobs_.value(job->attId) != job)
        return; // failed meanwhile (a write error)
    if ((status == 200 || status == 206) && reply->error() == QNetworkReply::NoError) {
        job->part->close();
        if (job->total >= 0 && job->received != job->total)
            return retryLater(job, QStringLiteral("the transfer ended at %1 of %2 bytes").arg(job->received).arg(job->total));
        return verifyAndDeliver(job);
    }
    if (job->part) {
        job->part->flush(); // keep what arrived: the next try resumes after it
        job->part->close();
    }
    if (job->status == -1 || status == 416) {
        // The server's range does not fit the partial: start over from 0.
        QFile::remove(job->partPath);
        QFile::remove(job->etagPath);
        if (job->fromZeroAgain)
            return fail(job, QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("the server's range does not fit"));
        job->fromZeroAgain = true;
        return request(job);
    }
    if (status >= 400 && status < 500) {
        const QJsonObject body = QJsonDocument::fromJson(reply->readAll()).object();
        QString code = body.value(QStringLiteral("code")).toString();
        if (status == 404 || status == 403)
            code = QStringLiteral("NOT_FOUND"); // unknown and not ours alike (server.md)
        else if (status == 401)
            code = QStringLiteral("UNAUTHENTICATED");
        else if (code.isEmpty())
            code = QStringLiteral("HTTP_%1").arg(status);
        return fail(job, code, body.value(QStringLiteral("message")).toString(reply->errorString()));
    }
    const QNetworkReply::NetworkError e = reply->error();
    if (e == QNetworkReply::SslHandshakeFailedError)
        return fail(job, QStringLiteral("TLS_ERROR"), reply->errorString());
    retryLater(job, status > 0 ? QStringLiteral("HTTP %1").arg(status) : reply->errorString());
}

void Downloads::retryLater(const std::shared_ptr<Job> &job, const QString &why) {
    if (++job->retries > MaxRetries)
        return fail(job, QStringLiteral("UNAVAILABLE"),
                    QStringLiteral("download of %1 stopped (%2); the part received is kept").arg(job->attId, why));
    QTimer::singleShot(250 << std::min(job->retries - 1, 6), this, [this, job] {
        if (jobs_.value(job->attId) == job)
            request(job);
    });
}

void Downloads::verifyAndDeliver(const std::shared_ptr<Job> &job) {
    const QString sha = job->meta ? job->meta->sha256.toLower() : unquoted(job->etag).toLower();
    const qint64 size = job->meta ? job->meta->size : job->total;
    if (sha.size() != 64)
        return fail(job, QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("no SHA-256 known for %1").arg(job->attId));
    job->working = true;
    const QString part = job->partPath, etagPath = job->etagPath, cache = job->cachePath;
    const QStringList targets = job->targets;
    offThread(this,
              [part, etagPath, cache, targets, sha, size]() -> QString {
                  QFile f(part);
                  if (!f.open(QIODevice::ReadOnly))
                      return QStringLiteral("!cannot read ") + part;
                  QCryptographicHash h(QCryptographicHash::Sha256);
                  if (!h.addData(&f))
                      return QStringLiteral("!cannot read ") + part;
                  const qint64 got = f.size();
                  f.close();
                  if ((size >= 0 && got != size) || QString::fromLatin1(h.result().toHex()) != sha) {
                      QFile::remove(part); // corrupt: never kept, never resumed
                      QFile::remove(etagPath);
                      return QStringLiteral("DIGEST_MISMATCH");
                  }
                  QFile::remove(cache);
                  if (!QFile::rename(part, cache))
                      return QStringLiteral("!cannot move the download into %1").arg(cache);
                  QFile::remove(etagPath);
                  touch(cache);
                  const QString e = copyToTargets(cache, targets);
                  return e.isEmpty() ? QString() : u'!' + e;
              },
              [this, job, targets](const QString &result) {
                  job->working = false;
                  if (jobs_.value(job->attId) != job)
                      return;
                  if (result == u"DIGEST_MISMATCH") {
                      // The bytes on disk are not the attachment's (a
                      // corrupted partial, or a bad transfer): once more
                      // from 0, then give up.
                      if (!job->fromZeroAgain) {
                          job->fromZeroAgain = true;
                          job->retries = 0;
                          return request(job);
                      }
                      return fail(job, QStringLiteral("DIGEST_MISMATCH"),
                                  QStringLiteral("the bytes of %1 do not match its SHA-256").arg(job->attId));
                  }
                  if (!result.isEmpty())
                      return fail(job, QStringLiteral("STORAGE_ERROR"), result.mid(1));
                  const QStringList late = job->targets.mid(targets.size());
                  jobs_.remove(job->attId);
                  for (const QString &t : targets)
                      emit finished(job->attId, t);
                  evict();
                  QString ignored;
                  for (const QString &t : late)
                      start(job->attId, t, &ignored); // from the cache now
              });
}

void Downloads::deliverFromCache(const std::shared_ptr<Job> &job, const QString &cached) {
    job->working = true;
    const QStringList targets = job->targets;
    offThread(this,
              [cached, targets]() -> QString {
                  touch(cached); // most recently used
                  return copyToTargets(cached, targets);
              },
              [this, job, targets](const QString &result) {
                  job->working = false;
                  if (jobs_.value(job->attId) != job)
                      return;
                  if (!result.isEmpty())
                      return fail(job, QStringLiteral("STORAGE_ERROR"), result);
                  const QStringList late = job->targets.mid(targets.size());
                  jobs_.remove(job->attId);
                  for (const QString &t : targets)
                      emit finished(job->attId, t);
                  QString ignored;
                  for (const QString &t : late)
                      start(job->attId, t, &ignored);
              });
}

void Downloads::fail(const std::shared_ptr<Job> &job, const QString &code, const QString &message) {
    if (jobs_.value(job->attId) == job)
        jobs_.remove(job->attId);
    job->part.reset();
    emit failed(job->attId, code, message);
}

void Downloads::evict() {
    const QString dir = cacheDir();
    if (dir.isEmpty())
        return;
    // Least recently used first (a use sets the file's mtime); the files
    // of downloads being delivered stay.
    QFileInfoList files = QDir(dir).entryInfoList(QDir::Files | QDir::NoDotAndDotDot, QDir::Time | QDir::Reversed);
    qint64 total = 0;
    for (const QFileInfo &f : std::as_const(files))
        total += f.size();
    QSet<QString> busy;
    for (const auto &job : std::as_const(jobs_))
        if (job->working)
            busy.insert(QFileInfo(job->cachePath).fileName());
    for (const QFileInfo &f : std::as_const(files)) {
        if (total <= cacheLimit_)
            break;
        if (busy.contains(f.fileName()))
            continue;
        if (QFile::remove(f.absoluteFilePath()))
            total -= f.size();
    }
}

} // namespace im::detail
