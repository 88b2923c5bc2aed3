// Paths that the build compiles into a test (IM_SERVER_BIN, IM_SEED_BIN,
// IM_KILLHELPER, ...) are relative to the folder of the test's own
// executable (CMake's im_exe_relative_define), so that the compile command,
// and with it the compiler cache's key, is the same in every clone
// (scripts/ccache-env.sh). This resolves one at run time, once the
// application object exists. Before it exists, or without Qt:
// tests/support/exe_relative.hpp.
#pragma once

#include <QtCore/QCoreApplication>
#include <QtCore/QDir>
#include <QtCore/QString>

inline QString exeRelativePath(const char *relativeToExecutable) {
    const QDir exeDir(QCoreApplication::applicationDirPath());
    return QDir::cleanPath(exeDir.absoluteFilePath(QString::fromUtf8(relativeToExecutable)));
}
