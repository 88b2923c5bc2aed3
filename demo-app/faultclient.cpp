#include "faultclient.h"

#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtNetwork/QNetworkRequest>

FaultClient::FaultClient(QObject *parent) : QObject(parent), nam_(new QNetworkAccessManager(this)) {}

QUrl FaultClient::labUrl(const QUrl &wsUrl) {
    QUrl u;
    u.setScheme(wsUrl.scheme() == QLatin1String("wss") ? QStringLiteral("https") : QStringLiteral("http"));
    u.setHost(wsUrl.host());
    u.setPort(wsUrl.port(wsUrl.scheme() == QLatin1String("wss") ? 443 : 80));
    u.setPath(QStringLiteral("/lab/fault"));
    return u;
}

QString FaultClient::spec(const QString &point, const QString &action, int count) {
    QString s = point.trimmed() + QLatin1Char('=') + action.trimmed();
    if (count > 0)
        s += QLatin1Char(':') + QString::number(count);
    return s;
}

void FaultClient::post(const QUrl &wsUrl, const QString &body) {
    const QUrl url = labUrl(wsUrl);
    QNetworkRequest req(url);
    req.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("text/plain"));
    req.setTransferTimeout(10000);
    QNetworkReply *reply = nam_->post(req, body.toUtf8());
    connect(reply, &QNetworkReply::finished, this, [this, reply, url, body] {
        reply->deleteLater();
        const int status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
        const QString text = QString::fromUtf8(reply->readAll()).trimmed();
        QString summary;
        if (status == 0)
            summary = QStringLiteral("no HTTP answer from %1: %2").arg(url.toString(), reply->errorString());
        else if (status == 404)
            summary = QStringLiteral("HTTP 404 %1: server faults are disabled (start imserver with --enable-faults)")
                          .arg(text);
        else
            summary = QStringLiteral("HTTP %1 %2 (sent \"%3\")").arg(status).arg(text, body);
        emit answered(status, summary);
    });
}
