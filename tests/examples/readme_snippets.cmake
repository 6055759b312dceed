# Compiles the code blocks of README.md that claim to be whole programs or
# functions: the ```c block of "## C" (plain C99, -Werror) against the
# headers in include/. Run by CTest (tests/examples/tests.cmake):
#   cmake -DREADME=... -DINCLUDE=... -DCC=... -DWORK=... -P readme_snippets.cmake
file(READ ${README} text)
string(FIND "${text}" "\n## C\n" section)
if(section EQUAL -1)
  message(FATAL_ERROR "README.md has no '## C' section")
endif()
string(SUBSTRING "${text}" ${section} -1 text)
string(FIND "${text}" "```c\n" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "README.md's '## C' section has no ```c block")
endif()
math(EXPR begin "${begin} + 5")
string(SUBSTRING "${text}" ${begin} -1 text)
string(FIND "${text}" "```" end)
string(SUBSTRING "${text}" 0 ${end} snippet)
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/readme_c_snippet.c "${snippet}")
execute_process(COMMAND ${CC} -std=c99 -Wall -Wextra -Werror -pedantic -I${INCLUDE} -c readme_c_snippet.c
                        -o readme_c_snippet.o
                WORKING_DIRECTORY ${WORK} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "README.md's C snippet does not compile:\n${out}")
endif()
message(STATUS "README.md's C snippet compiles")
