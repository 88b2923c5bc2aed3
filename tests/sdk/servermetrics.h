// The real server's request counters, read from its /metrics (on the
// WebSocket listener's port): what an outside observer counts.
#pragma once

#include <QtCore/QRegularExpression>
#include <QtCore/QUrl>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtNetwork/QNetworkRequest>
#include <QtTest/QTest>

#include <memory>

// The sum of im_requests_total{t="<type>",...} over every result code, or
// -1 if /metrics did not answer within 10 s. `wsUrl` is the server's
// ws://host:port/v1/ws.
inline qint64 serverRequests(const QUrl &wsUrl, const QString &type) {
    QUrl url = wsUrl;
    url.setScheme(QStringLiteral("http"));
    url.setPath(QStringLiteral("/metrics"));
    QNetworkAccessManager http;
    std::unique_ptr<QNetworkReply> reply(http.get(QNetworkRequest(url)));
    if (!QTest::qWaitFor([&] { return reply->isFinished(); }, 10000) || reply->error() != QNetworkReply::NoError)
        return -1;
    const QRegularExpression line(QStringLiteral(R"(^im_requests_total\{t="%1",[^}]*\} (\d+))")
                                      .arg(QRegularExpression::escape(type)),
                                  QRegularExpression::MultilineOption);
    qint64 n = 0;
    for (auto it = line.globalMatch(QString::fromUtf8(reply->readAll())); it.hasNext();)
        n += it.next().captured(1).toLongLong();
    return n;
}
