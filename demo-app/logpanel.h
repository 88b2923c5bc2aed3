// The log pane of a chat window: the SDK's logging categories (im.sdk.*:
// client, connection, outbox, storage) as they are written. A Qt message
// handler (LogHub) is installed once per process; it hands every message on
// to the handler that was there before (stderr, or QtTest's) and forwards
// the im.sdk.* ones to every log pane. The messages are the process's: with
// two windows open each pane shows both clients' lines.
#pragma once

#include <QtCore/QObject>
#include <QtWidgets/QGroupBox>

class QCheckBox;
class QLabel;
class QPlainTextEdit;

/// The process-wide message handler behind the log panes.
class LogHub : public QObject {
    Q_OBJECT
public:
    /// The hub; installs the message handler on first use.
    static LogHub *instance();
    /// "HH:mm:ss.zzz info im.sdk.connection welcome: ..." (how a pane shows it).
    static QString format(QtMsgType type, const char *category, const QString &message);

Q_SIGNALS:
    /// An im.sdk.* message (emitted in the thread that logged it).
    void logged(const QString &line);

private:
    LogHub() = default;
};

class LogPanel : public QGroupBox {
    Q_OBJECT
public:
    explicit LogPanel(QWidget *parent = nullptr);

    /// Everything the pane shows (one line per message).
    QString text() const;
    /// Lines the pane has received since it was created or cleared.
    int lineCount() const { return lines_; }

public Q_SLOTS:
    void append(const QString &line);
    void clear();
    /// Debug messages of im.sdk.* on or off (QLoggingCategory::setFilterRules:
    /// process-wide; QT_LOGGING_RULES in the environment still wins).
    void setDebugEnabled(bool on);

private:
    QPlainTextEdit *view_;
    QCheckBox *debug_;
    QLabel *count_;
    int lines_ = 0;
};
