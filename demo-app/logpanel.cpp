#include "logpanel.h"

#include <QtCore/QDateTime>
#include <QtCore/QLoggingCategory>
#include <QtWidgets/QCheckBox>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QPlainTextEdit>
#include <QtWidgets/QPushButton>
#include <QtWidgets/QVBoxLayout>

#include <cstdio>
#include <cstring>

namespace {

QtMessageHandler previousHandler = nullptr;
LogHub *hub = nullptr;
thread_local bool inHandler = false; // a pane that logs while appending must not loop

void handler(QtMsgType type, const QMessageLogContext &context, const QString &message) {
    // Still to stderr (or QtTest's log): whatever was installed before.
    if (previousHandler)
        previousHandler(type, context, message);
    else
        fprintf(stderr, "%s\n", qUtf8Printable(qFormatLogMessage(type, context, message)));
    if (inHandler || !hub || !context.category || std::strncmp(context.category, "im.sdk", 6) != 0)
        return;
    inHandler = true;
    emit hub->logged(LogHub::format(type, context.category, message));
    inHandler = false;
}

} // namespace

LogHub *LogHub::instance() {
    if (!hub) {
        hub = new LogHub; // lives as long as the process (the handler may run until exit)
        previousHandler = qInstallMessageHandler(handler);
    }
    return hub;
}

QString LogHub::format(QtMsgType type, const char *category, const QString &message) {
    const char *level = "debug";
    switch (type) {
    case QtDebugMsg: level = "debug"; break;
    case QtInfoMsg: level = "info"; break;
    case QtWarningMsg: level = "warning"; break;
    case QtCriticalMsg: level = "critical"; break;
    case QtFatalMsg: level = "fatal"; break;
    }
    return QStringLiteral("%1 %2 %3 %4")
        .arg(QTime::currentTime().toString(QStringLiteral("HH:mm:ss.zzz")), QLatin1String(level),
             QLatin1String(category), message);
}

LogPanel::LogPanel(QWidget *parent) : QGroupBox(tr("SDK log (im.sdk.*)"), parent) {
    setObjectName(QStringLiteral("logPanel"));
    view_ = new QPlainTextEdit;
    view_->setObjectName(QStringLiteral("logView"));
    view_->setReadOnly(true);
    view_->setMaximumBlockCount(5000);
    view_->setLineWrapMode(QPlainTextEdit::NoWrap);
    QFont mono(QStringLiteral("monospace"));
    mono.setStyleHint(QFont::Monospace);
    view_->setFont(mono);
    debug_ = new QCheckBox(tr("Debug messages"));
    debug_->setObjectName(QStringLiteral("logDebugCheck"));
    debug_->setToolTip(tr("QLoggingCategory rule im.sdk.*.debug=true (for the whole app; QT_LOGGING_RULES in the "
                          "environment takes precedence)"));
    connect(debug_, &QCheckBox::toggled, this, &LogPanel::setDebugEnabled);
    auto *clearButton = new QPushButton(tr("Clear"));
    clearButton->setObjectName(QStringLiteral("clearLogButton"));
    connect(clearButton, &QPushButton::clicked, this, &LogPanel::clear);
    count_ = new QLabel;
    count_->setObjectName(QStringLiteral("logCount"));
    auto *top = new QHBoxLayout;
    top->addWidget(debug_);
    top->addWidget(count_, 1);
    top->addWidget(clearButton);
    auto *l = new QVBoxLayout(this);
    l->addLayout(top);
    l->addWidget(view_, 1);
    clear();
    // Queued when logged from another thread (AutoConnection).
    connect(LogHub::instance(), &LogHub::logged, this, &LogPanel::append);
}

QString LogPanel::text() const { return view_->toPlainText(); }

void LogPanel::append(const QString &line) {
    ++lines_;
    view_->appendPlainText(line);
    count_->setText(tr("%1 line(s)").arg(lines_));
}

void LogPanel::clear() {
    view_->clear();
    lines_ = 0;
    count_->setText(tr("0 lines"));
}

void LogPanel::setDebugEnabled(bool on) {
    QLoggingCategory::setFilterRules(on ? QStringLiteral("im.sdk.*.debug=true")
                                        : QStringLiteral("im.sdk.*.debug=false"));
    if (debug_->isChecked() != on)
        debug_->setChecked(on);
}
